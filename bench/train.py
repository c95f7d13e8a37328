"""Training figures: trained tokens/s of the PyTorch trainer on CPU, and where a loop iteration's time goes.

    python bench/train.py                      # trainer, ranks and loop
    python bench/train.py --part trainer       # tokens/s only (tiny-qwen3 and tiny-chatml fixtures)
    python bench/train.py --part ranks         # Megatron's tokens/s on 1, 2 and 4 ranks (torchrun)
    python bench/train.py --part loop --iterations 6
    python bench/train.py --part tool --png docs/tool-task-curves.png   # the tool task's curves, 3 seeds

`trainer`: one optimizer step (forward, backward, AdamW) over `--rows` segments of `--prompt` +
`--response` tokens (70% of the response trainable), after one warm-up step; tokens/s counts every
token the model runs on, trainable tokens/s only the masked-in ones. The peer is the model's plain
forward+backward of the same batch with a cross-entropy loss (what any trainer must pay at least).
`ranks`: the Megatron trainer's step, same batch, under torchrun (gloo) on 1 rank, 2 (tp=2, dp=2)
and 4 (tp2 x dp2, tp2 x pp2, dp4), tokens/s and the ratio to its one-rank figure.
`loop`: `rlgw train` on trainer/configs/word-tiny.json (real gateway sessions, delta disk sync); the
share of each iteration in rollout, train and sync, from its receipts.
`tool`: `rlgw train` on trainer/configs/tool-tiny.json (the two-turn tool task) for each of `--seeds`:
the mean reward per iteration and the run's wall time; `--png` also plots them (needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def _step(model_dir: Path, rows: int, prompt: int, response: int, seed: int = 0):
    from rlgw.gateway.engine_semantics import embedded_semantics
    from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
    from rlgw.trainer.batch import Rollout, build_step

    rng = np.random.default_rng(seed)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rollouts = []
    engine = embedded_semantics("synthetic").to_metadata()
    for k in range(rows):
        mask = (rng.random(response) < 0.7).astype(np.uint8)
        mask[0] = 1
        lps = np.where(mask == 1, -rng.random(response), 0.0).astype(np.float32)
        ids = rng.integers(0, min(vocab, 4000), prompt + response).astype(np.int32)
        at_t1 = {"turn_temperature": [{"turn": 0, "temperature": 1.0}], "engine": engine}
        s = Sample(ids, response, mask, lps, float(k % 2), SampleStatus.COMPLETED, f"r{k}", k // 4,
                   [VersionSpan("0", 0, response)], at_t1)  # fmt: skip
        rollouts.append(Rollout(f"r{k}", k // 4, float(k % 2), [s]))
    return build_step(rollouts, micro_batch_rows=8)


def _time_steps(trainer: Any, step: Any, repeat: int) -> float:
    """Median seconds of `repeat` optimizer steps on `step`, after one warm-up step."""
    trainer.train_step(step)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        trainer.train_step(step)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_trainer(args: argparse.Namespace) -> None:
    from rlgw.trainer.objective import LossConfig
    from rlgw.trainer.torch_trainer import OptimConfig, TorchTrainer

    torch.set_num_threads(args.threads)
    print(f"PyTorch trainer, CPU, {args.threads} thread(s): {args.rows} rows x ({args.prompt} prompt + "
          f"{args.response} response) tokens, micro-batches of 8")  # fmt: skip
    for name in ("tiny-qwen3", "tiny-chatml"):
        model_dir = REPO / "tests" / "fixtures" / name
        trainer = TorchTrainer(model_dir, LossConfig(), OptimConfig(lr=1e-5))
        step = _step(model_dir, args.rows, args.prompt, args.response)
        tokens = sum(int(mb.attention_mask.sum()) for mb in step.micro_batches)
        t = _time_steps(trainer, step, args.repeat)
        peer = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            trainer.optimizer.zero_grad()
            for mb in step.micro_batches:
                logits = trainer.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
                torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1), mb.input_ids[:, 1:].flatten()
                ).backward()
            trainer.optimizer.step()
            peer.append(time.perf_counter() - t0)
        p = statistics.median(peer)
        print(f"  {name:12s} step {t * 1e3:7.1f} ms  {tokens / t:9.0f} tokens/s  "
              f"{step.trainable_tokens / t:8.0f} trainable tokens/s  | plain CE fwd+bwd+AdamW "
              f"{p * 1e3:7.1f} ms (rlgw step / plain = {t / p:.2f}x)")  # fmt: skip


RANK_SPLITS = [(1, 1, 1), (2, 1, 2), (1, 1, 2), (2, 1, 4), (2, 2, 4), (1, 1, 4)]  # (tp, pp, world)


def bench_ranks(args: argparse.Namespace) -> None:
    """The Megatron trainer's step on 1, 2 and 4 processes (gloo, CPU), each a torchrun launch."""
    import os

    print(f"Megatron trainer, CPU (gloo), 1 thread per rank: {args.rows} rows x ({args.prompt} prompt + "
          f"{args.response} response) tokens, micro-batches of 8, tiny-qwen3; this machine has "
          f"{os.cpu_count()} cores, shared: more ranks than cores time-share them")  # fmt: skip
    one = None
    for tp, pp, world in RANK_SPLITS:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
               str(Path(__file__).resolve()), "--part", "ranks-worker", "--tp", str(tp), "--pp", str(pp),
               "--rows", str(args.rows), "--prompt", str(args.prompt), "--response", str(args.response),
               "--repeat", str(args.repeat)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode or not lines:
            print(f"  tp{tp} pp{pp} on {world}: failed\n{done.stderr[-3000:]}")
            continue
        r = json.loads(lines[-1])
        one = one or r["tokens_per_s"]
        rate = r["tokens_per_s"]
        print(f"  {world} rank(s) tp{tp} pp{pp} dp{world // (tp * pp)}: step {r['step_s'] * 1e3:7.1f} ms  "
              f"{rate:8.0f} tokens/s  ({rate / one:.2f}x the one-rank figure)")  # fmt: skip


def ranks_worker(args: argparse.Namespace) -> None:
    """One rank of `bench_ranks`: rank 0 times `train_step` and prints a JSON line."""
    from rlgw.trainer.megatron_trainer import MegatronTrainer
    from rlgw.trainer.objective import LossConfig
    from rlgw.trainer.torch_trainer import OptimConfig

    torch.set_num_threads(1)
    model_dir = REPO / "tests" / "fixtures" / "tiny-qwen3"
    trainer = MegatronTrainer(model_dir, LossConfig(), OptimConfig(lr=1e-5), tp=args.tp, pp=args.pp)
    if not trainer.layout.driver:
        trainer.follow()
        return
    step = _step(model_dir, args.rows, args.prompt, args.response)
    tokens = sum(int(mb.attention_mask.sum()) for mb in step.micro_batches)
    t = _time_steps(trainer, step, args.repeat)
    trainer.close()
    print(json.dumps({"step_s": t, "tokens_per_s": tokens / t}))


def bench_loop(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="rlgw-bench-train-") as tmp:
        cmd = [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config",
               str(REPO / "trainer" / "configs" / "word-tiny.json"), "--work-dir", tmp, "--iterations",
               str(args.iterations), "--no-progress"]  # fmt: skip
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        receipts = [json.loads(x) for x in (Path(tmp) / "receipts.jsonl").read_text().splitlines()]
    print(f"loop: rlgw train on word-tiny.json (32 sessions/iteration, GRPO, xor delta disk sync), "
          f"{len(receipts)} iterations")  # fmt: skip
    for r in receipts:
        s = r["seconds"]
        share = r["share"]
        print(f"  it {r['iteration']}: total {s['total']:.2f}s  rollout {share['rollout']:.0%}  "
              f"train {share['train']:.0%}  sync {share['sync']:.0%}  "
              f"reward {r['reward_mean']:.2f}")  # fmt: skip
    steady = receipts[1:] or receipts
    for part in ("rollout", "train", "sync"):
        share = statistics.mean(r["share"][part] for r in steady)
        secs = statistics.mean(r["seconds"][part] for r in steady)
        print(f"  mean after the first iteration: {part:8s} {secs:6.2f}s  {share:5.1%}")


def bench_tool(args: argparse.Namespace) -> None:
    curves: dict[int, list[float]] = {}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="rlgw-bench-tool-") as tmp:
            cmd = [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config",
                   str(REPO / "trainer" / "configs" / "tool-tiny.json"), "--work-dir", tmp, "--seed",
                   str(seed), "--no-progress"]  # fmt: skip
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
            wall = time.perf_counter() - t0
            receipts = [json.loads(x) for x in (Path(tmp) / "receipts.jsonl").read_text().splitlines()]
        curves[seed] = [r["reward_mean"] for r in receipts]
        print(f"seed {seed}: {wall:.0f}s wall (start-up included), mean reward per iteration: "
              + " ".join(f"{x:.2f}" for x in curves[seed]))  # fmt: skip
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for seed, ys in curves.items():
            ax.plot(range(len(ys)), ys, marker="o", label=f"seed {seed}")
        ax.set(xlabel="iteration", ylabel="mean reward (32 sessions)", ylim=(-0.02, 1.02),
               title="tool-tiny.json: call locate, answer with its city (tiny Qwen3, CPU)")  # fmt: skip
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png)
        print(f"wrote {args.png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--part", choices=("trainer", "ranks", "ranks-worker", "loop", "tool", "all"), default="all"
    )
    p.add_argument("--tp", type=int, default=1, help="(ranks-worker) tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="(ranks-worker) pipeline-parallel size")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--png", default=None, help="with --part tool: plot the curves to this file")
    args = p.parse_args()
    if args.part in ("trainer", "all"):
        bench_trainer(args)
    if args.part in ("ranks", "all"):
        bench_ranks(args)
    if args.part == "ranks-worker":
        ranks_worker(args)
    if args.part in ("loop", "all"):
        bench_loop(args)
    if args.part == "tool":
        bench_tool(args)


if __name__ == "__main__":
    main()
