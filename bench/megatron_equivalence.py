"""The Megatron trainer split over ranks against one rank: loss, gradient and weight gaps per split.

    python -m bench.megatron_equivalence              # CPU, gloo: 1, 2 and 4 processes (a few minutes)
    python -m bench.megatron_equivalence --device cuda  # NCCL, needs 4 GPUs for the 4-process splits

Runs `rlgw.trainer.megatron_probe` (one step of the full objective on a fixed batch of 5 rollouts,
7 segments, temperatures 1.0 and 0.7, tiny-qwen3) once on one process and once per launch of 2 and
4 processes, then prints per split: the loss's relative gap, the largest absolute gap of the
gathered gradients, of the published weights after the AdamW step (elements whose gradient is
within 1e-6 of zero excluded, then included), the grad norm's relative gap, and whether the
weights published before the step are the checkpoint bit for bit (HF -> sharded Megatron -> HF),
and the share of its parameters' Adam state that rank 0 holds ("distopt": megatron-core's
distributed optimizer, which shards it over the dp replicas; otherwise 1). The issue's bounds:
loss 1e-5, gradients and weights 1e-4. With 2 processes, the same for a tiny Qwen3-MoE (4 experts,
top-2; `tests.trainer.support.tiny_qwen3_moe`) at ep=2 against its own one rank. Then the pure
conversion round trip
(no processes) for every split of tiny-qwen3 tied / untied with q/k/v biases and tiny-chatml,
with and without vocabulary padding.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
LAUNCHES = {
    2: ["2x1x100", "1x1", "1x2", "1x1:distopt"],
    4: ["2x1", "2x2", "1x2", "2x1:distopt", "1x2:distopt"],
}


def launch(out: Path, world: int, splits: list[str], device: str, model: Path | None = None) -> float:
    """Run the probe's `splits` on `world` processes (on `model`, default the probe's); wall seconds."""
    cmd = [sys.executable]
    if world > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    cmd += ["-m", "rlgw.trainer.megatron_probe", "--device", device, "--out", str(out)]
    cmd += ["--model", str(model)] if model else []
    for s in splits:
        cmd += ["--split", s]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"probe on {world} process(es) failed:\n{done.stderr[-4000:]}")
    return time.perf_counter() - t0


def round_trips() -> None:
    """The conversion alone: every split, bit for bit."""
    from safetensors.torch import load_file

    from rlgw.trainer.megatron_convert import (
        Split,
        hf_to_megatron,
        megatron_to_hf,
        padded_vocab,
        shard,
        unshard,
    )

    print("\nHF -> Megatron -> shards -> whole -> HF (no processes), bit for bit:")
    for name, untied in (("tiny-qwen3", False), ("tiny-qwen3", True), ("tiny-chatml", False)):
        hf = json.loads((REPO / "tests/fixtures" / name / "config.json").read_text())
        state = load_file(str(REPO / "tests/fixtures" / name / "model.safetensors"))
        if untied:
            hf["tie_word_embeddings"] = False
            state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
        results = []
        for tp, pp, pad in itertools.product((1, 2), (1, 2), (128, 100)):
            split, rows = Split(tp, pp), padded_vocab(hf["vocab_size"], tp, pad)
            full = hf_to_megatron(hf, state)
            pieces = {(t, p, 0): shard(hf, full, split, t, p, rows) for t in range(tp) for p in range(pp)}
            back = megatron_to_hf(hf, unshard(hf, pieces, split))
            ok = set(back) == set(state) and all(torch.equal(back[k], v) for k, v in state.items())
            results.append(f"tp{tp}pp{pp} vocab {rows}: {'equal' if ok else 'DIFFERENT'}")
        print(f"  {name}{' (untied)' if untied else ''}: " + "; ".join(results))


def row(path: Path, one: dict, tag: str = "") -> None:
    """Print the gaps of the probe at `path` to the one-rank probe `one`."""
    from rlgw.trainer.megatron_probe import compare

    split = torch.load(path)
    g = compare(split, one)
    s = split["split"]
    name = f"tp{s['tp']} pp{s['pp']} dp{s['dp']}" + (f" ep{s['ep']}" if s.get("ep", 1) > 1 else "")
    name += (" pad" if "pad" in path.stem else "") + (" distopt" if "distopt" in path.stem else "") + tag
    held = split["held"]["exp_avg"] / split["held"]["params"]
    print(f"  {name:20s} {g['loss_rel']:9.1e} {g['grad_abs']:9.1e} {g['weights_after']:9.1e} "
          f"{g['weights_after_all']:9.1e} {g['grad_norm_rel']:9.1e} {held:9.2f}  "
          f"{'bit for bit' if g['before_bitwise'] else 'DIFFERENT'}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlgw-megatron-eq-") as tmp:
        out = Path(tmp)
        walls = {1: launch(out / "one", 1, ["1x1"], args.device)}
        for world in args.worlds:
            walls[world] = launch(out / str(world), world, LAUNCHES[world], args.device)
        one = torch.load(out / "one" / "tp1pp1dp1.pt")
        backend = "gloo, CPU" if args.device == "cpu" else "NCCL"
        print(f"Megatron split vs one rank, one step on tiny-qwen3 ({backend}); launch wall times "
              + ", ".join(f"{w} proc {s:.0f}s" for w, s in walls.items()))  # fmt: skip
        print(f"  {'split':20s} {'loss rel':>9s} {'grad abs':>9s} {'w after':>9s} {'w after*':>9s} "
              f"{'norm rel':>9s} {'adam held':>9s}  before == checkpoint")  # fmt: skip
        for world in args.worlds:
            for f in sorted((out / str(world)).glob("*.pt")):
                row(f, one)
        if 2 in args.worlds:  # Qwen3-MoE, experts over two expert-parallel ranks
            from tests.trainer.support import tiny_qwen3_moe

            moe = tiny_qwen3_moe(out / "moe-model")
            launch(out / "moe-one", 1, ["1x1"], args.device, moe)
            launch(out / "moe", 2, ["1x1-ep2"], args.device, moe)
            row(out / "moe" / "tp1pp1dp2ep2.pt", torch.load(out / "moe-one" / "tp1pp1dp1.pt"), " moe")
        print("  (w after*: every element, including those whose gradient is within 1e-6 of zero, where "
              "Adam's first step is lr * g / (|g| + eps) and rounding of g moves it by up to lr = 1e-3;"
              " 'pad': vocabulary padded 4096 -> 4200 rows)")  # fmt: skip
    round_trips()


if __name__ == "__main__":
    main()
