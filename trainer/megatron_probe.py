"""One Megatron training step at a given split, saved for comparison with the one-rank step.

    torchrun --nproc-per-node 4 -m rlgw.trainer.megatron_probe --split 2x2 --split 2x1 --out DIR
    torchrun --nproc-per-node 2 -m rlgw.trainer.megatron_probe --split 1x1:distopt --out DIR
    python -m rlgw.trainer.megatron_probe --out DIR          # the one-rank reference: DIR/tp1pp1dp1.pt
    torchrun --nproc-per-node 2 -m rlgw.trainer.megatron_probe --model MOE --split 1x1-ep2 --out DIR

Every rank builds its piece of the model; rank 0 runs, on a fixed synthetic step (several
rollouts, split segments, two temperatures, uneven micro-batches), `loss_and_backward`, gathers
the reduced gradients under HF names, then one `train_step`, and saves the metrics, the
gradients, the exported weights before and after, and how much Adam state rank 0 holds, under
`--out` (`torch.save`). `:distopt` after a split steps with megatron-core's distributed optimizer.
`compare` reads two such files and gives the largest gaps; `bench/megatron_equivalence.py` and the
tests use it.
This module owns no training logic: it drives `MegatronTrainer` as the loop would.
"""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlgw.trainer.batch import StepBatch

REPO = Path(__file__).resolve().parents[1]

# The step's objective: clipped PPO with dual clip, old logprobs recomputed (a forward-only pass
# first) and truncated IS, an entropy bonus: every part of the objective runs on every stage layout.
LOSS = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "entropy_coef": 0.01,
        "old_log_probs": "recompute", "tis_cap": 2.0}  # fmt: skip


def synthetic_step(vocab: int, seed: int = 0) -> StepBatch:
    """Five rollouts (two of them in two segments), temperatures 1.0 and 0.7, micro-batches of 2 rows."""
    from rlgw.gateway.engine_semantics import embedded_semantics
    from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
    from rlgw.trainer.batch import Rollout, build_step

    rng = np.random.default_rng(seed)
    rollouts = []
    engine = embedded_semantics("synthetic").to_metadata()
    shapes = [(9, 14, 2), (6, 8, 1), (11, 5, 1), (7, 12, 2), (5, 9, 1)]
    for k, (prompt, response, segments) in enumerate(shapes):
        tokens = rng.integers(0, min(vocab, 4000), prompt + response).tolist()
        mask = (rng.random(response) > 0.3).astype(np.uint8)
        lps = np.where(mask == 1, -rng.random(response) * 3, 0.0).astype(np.float32)
        temperature = 0.7 if k % 2 else 1.0
        cuts = [0, response // 2, response] if segments == 2 else [0, response]
        segs = []
        for a, b in itertools.pairwise(cuts):
            n = b - a
            m = mask[a:b].copy()
            m[0] = 1
            meta = {"turn_temperature": [{"turn": 0, "temperature": temperature}], "engine": engine}
            ids = np.asarray(tokens[: prompt + b], np.int32)
            segs.append(Sample(ids, n, m, lps[a:b].copy(), float(k % 2), SampleStatus.COMPLETED, f"r{k}",
                               k // 3, [VersionSpan("0", 0, n)], meta))  # fmt: skip
        rollouts.append(Rollout(f"r{k}", k // 3, float(k % 2), segs))
    return build_step(rollouts, micro_batch_rows=2)


def run(
    model: Path, tp: int, pp: int, *, lr: float, vocab_divisible_by: int, device: str, ep: int = 1,
    distributed_optimizer: bool = False,
) -> dict[str, Any] | None:  # fmt: skip
    """The probe's step on this rank; rank 0 returns what it measured, the others None."""
    import json

    from rlgw.trainer.megatron_trainer import MegatronTrainer
    from rlgw.trainer.settings import LossConfig, OptimConfig

    trainer = MegatronTrainer(model, LossConfig(**LOSS), OptimConfig(lr=lr), device=device, tp=tp, pp=pp,
                              ep=ep, vocab_divisible_by=vocab_divisible_by,
                              distributed_optimizer=distributed_optimizer)  # fmt: skip
    if not trainer.layout.driver:
        trainer.follow()
        return None
    step = synthetic_step(json.loads((model / "config.json").read_text())["vocab_size"])
    metrics = trainer.loss_and_backward(step)
    grads = trainer.hf_gradients()
    before = dict(trainer.export_weights())
    step_metrics = trainer.train_step(step)
    after = dict(trainer.export_weights())
    trainer.close()
    layout = trainer.layout
    # what rank 0 holds: its parameters, and the elements of Adam's first moment it keeps for them
    # (torch's AdamW and megatron-core's optimizers both map each parameter to its state)
    held = {"params": sum(p.numel() for p in trainer.params),
            "exp_avg": sum(s["exp_avg"].numel() for _, s in trainer.optimizer.state.items())}  # fmt: skip
    return {"split": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep}, "metrics": metrics,
            "step_metrics": step_metrics, "grads": grads, "before": before, "after": after,
            "held": held}  # fmt: skip


def compare(split: dict[str, Any], one: dict[str, Any]) -> dict[str, float]:
    """Largest gaps of a split's probe to the one-rank probe: loss (relative), grads and weights (absolute).

    `weights_after` excludes the elements whose one-rank gradient is within 1e-6 of zero: Adam's
    first step there is lr * g / (|g| + eps), so rounding of g near eps (1e-8) moves it by up to
    lr; `weights_after_all` includes them.
    """
    loss = abs(split["metrics"]["loss"] - one["metrics"]["loss"]) / max(abs(one["metrics"]["loss"]), 1e-12)
    grad = max(float((split["grads"][k] - g).abs().max()) for k, g in one["grads"].items())
    steady = [(k, one["grads"][k].abs() > 1e-6) for k in one["after"] if k in one["grads"]]
    gap = {k: (split["after"][k].float() - w.float()).abs() for k, w in one["after"].items()}
    after = max(float(gap[k][m].max()) for k, m in steady)
    after_all = max(float(g.max()) for g in gap.values())
    before = all(torch.equal(split["before"][k], w) for k, w in one["before"].items())
    return {"loss_rel": loss, "grad_abs": grad, "weights_after": after, "weights_after_all": after_all,
            "grad_norm_rel": abs(split["step_metrics"]["grad_norm"] / one["step_metrics"]["grad_norm"] - 1),
            "before_bitwise": float(before)}  # fmt: skip


def parse_split(text: str) -> tuple[int, int, int, int, bool]:
    """ "TPxPP" or "TPxPPxPAD" (vocab_divisible_by), then optionally "-epEP" (expert parallelism) and
    ":distopt" (megatron-core's distributed optimizer) -> (tp, pp, pad, ep, distopt)."""
    m = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)(?:x([1-9]\d*))?(?:-ep([1-9]\d*))?(:distopt)?", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"--split wants TPxPP[xPAD][-epEP][:distopt], got {text!r}")
    return int(m[1]), int(m[2]), int(m[3] or 128), int(m[4] or 1), m[5] is not None


def probe_name(split: dict[str, int], pad: int, distopt: bool = False) -> str:
    """The file stem of a split's probe: tpTppPdpD, then epE when ep > 1, -padN when pad is not 128,
    and -distopt with the distributed optimizer."""
    ep = f"ep{split['ep']}" if split["ep"] > 1 else ""
    pads = "" if pad == 128 else f"-pad{pad}"
    return f"tp{split['tp']}pp{split['pp']}dp{split['dp']}{ep}{pads}{'-distopt' if distopt else ''}"


def main() -> None:
    from megatron.core import parallel_state

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REPO / "tests" / "fixtures" / "tiny-qwen3")
    p.add_argument("--split", type=parse_split, action="append", metavar="TPxPP[xPAD][-epEP][:distopt]",
                   help="tp x pp (x vocab_divisible_by, default 128) (-ep expert parallelism, default 1) "
                   "(:distopt: megatron-core's distributed optimizer); repeat to run several splits in one "
                   "launch (dp is what the world leaves); default 1x1")  # fmt: skip
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True,
                   help="a directory: one tpTppPdpD[epE][-padN][-distopt].pt per split")  # fmt: skip
    args = p.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for tp, pp, pad, ep, distopt in args.split or [(1, 1, 128, 1, False)]:
        result = run(args.model, tp, pp, lr=args.lr, vocab_divisible_by=pad, device=args.device, ep=ep,
                     distributed_optimizer=distopt)  # fmt: skip
        parallel_state.destroy_model_parallel()  # the next split forms its own groups
        if result is not None:
            torch.save(result, args.out / f"{probe_name(result['split'], pad, distopt)}.pt")


if __name__ == "__main__":
    main()
