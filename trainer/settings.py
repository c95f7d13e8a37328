"""The trainer's plain settings: how losses are reduced, the objective's and the optimizer's knobs.

Torch-free, so that reading a training config (`config.py`) loads no torch; the code they configure
(`losses.py`, `objective.py`, `torch_trainer.py`) imports them from here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal


class Reduction(enum.StrEnum):
    """How per-token terms become one loss.

    PER_ROLLOUT_MEAN: mean over each rollout's trainable tokens, then mean over rollouts (every
    segment of a rollout shares the rollout's denominator). PER_TOKEN: mean over all trainable
    tokens of the step (long rollouts weigh more).
    """

    PER_ROLLOUT_MEAN = "per_rollout_mean"
    PER_TOKEN = "per_token"


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Objective settings.

    `old_log_probs`: "rollout" takes the engine's `rollout_log_probs` as pi_old (the ratio is 1
    exactly when trainer and engine agree); "recompute" takes the trainer's own logprobs before the
    update as pi_old and corrects the engine/trainer gap with truncated IS (`tis_cap`).
    `kl_source`: "teacher" uses the samples' `teacher_log_probs`, "reference" a frozen copy of the
    initial policy (the trainer computes it).
    """

    reduction: Reduction = Reduction.PER_ROLLOUT_MEAN
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    old_log_probs: Literal["rollout", "recompute"] = "rollout"
    tis_cap: float | None = None
    kl_coef: float = 0.0
    kl_source: Literal["teacher", "reference"] = "reference"
    entropy_coef: float = 0.0


@dataclass(frozen=True, slots=True)
class OptimConfig:
    """AdamW settings; `grad_clip` is a max global grad norm (None: no clipping)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
