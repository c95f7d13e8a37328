"""From accepted rollouts to padded micro-batches, with the step-wide denominators the losses need.

A `Rollout` is one task run: its segments (samples sharing `rollout_id`), one reward, one group.
`build_step` assigns advantages (GRPO, per group), then packs every segment as one row into
micro-batches. Every per-token tensor is aligned to `input_ids`: position p holds what concerns
token p (its mask, its rollout logprob), which the model predicts from position p - 1; position 0
and the prompt are never trainable. Each row carries the temperature its tokens were sampled at
(`sample_temperature`), which the objective divides the logits by as the engine did. This module
knows nothing about models or the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from rlgw.engine.sampling import GREEDY_EPS
from rlgw.gateway.sample import Sample
from rlgw.trainer.losses import grpo_advantages
from rlgw.trainer.rollout import Rollout
from rlgw.trainer.routing_replay import routing_table


class TemperatureError(ValueError):
    """A sample's logprobs were taken at a temperature the trainer cannot reproduce (unknown or mixed)."""


@dataclass(slots=True)
class MicroBatch:
    """Padded rows (one per segment); per-token tensors are [rows, tokens], aligned to `input_ids`."""

    input_ids: Tensor  # int64
    attention_mask: Tensor  # int64, 1 on real tokens
    loss_mask: Tensor  # float32, 1 on trainable response tokens
    rollout_log_probs: Tensor  # float32, the engine's logprob of each token (0 elsewhere)
    advantages: Tensor  # float32 [rows]
    rollout_index: Tensor  # int64 [rows]: the row's rollout in the step
    temperature: Tensor  # float32 [rows]: what the engine divided the row's logits by
    teacher_log_probs: Tensor | None = None  # float32, when every row has them
    # int32 [rows, tokens, layers, top_k]: the engine's routed experts (-1: none), when a row has them
    routed_experts: Tensor | None = None

    @property
    def rows(self) -> int:
        """Number of segments in this micro-batch."""
        return int(self.input_ids.shape[0])


@dataclass(slots=True)
class StepBatch:
    """Everything one optimizer step trains on."""

    micro_batches: list[MicroBatch]
    rollout_tokens: Tensor  # int64 [n_rollouts]: trainable tokens per rollout, over the whole step
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def trainable_tokens(self) -> int:
        """Trainable tokens in the step."""
        return int(self.rollout_tokens.sum())


def assign_advantages(rollouts: list[Rollout], *, std_normalize: bool = True, eps: float = 1e-6) -> None:
    """Set each rollout's GRPO advantage from the rewards of its group."""
    if not rollouts:
        return
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)
    groups = torch.tensor([r.group for r in rollouts], dtype=torch.int64)
    for r, a in zip(rollouts, grpo_advantages(rewards, groups, std_normalize=std_normalize, eps=eps).tolist(),
                    strict=True):  # fmt: skip
        r.advantage = float(a)


def sample_temperature(sample: Sample) -> float:
    """The temperature the engine's logprobs of `sample` were taken at (its turns' `turn_temperature`).

    A greedy turn (temperature below the engine's 1e-6) has unscaled logprobs: temperature 1. A
    segment whose turns ran at different temperatures is refused: a row is scaled by one
    temperature, and the sample does not say which tokens each turn generated.
    """
    turns = sample.metadata.get("turn_temperature")
    if not turns:
        raise TemperatureError(
            f"sample of rollout {sample.rollout_id!r} has no turn_temperature in its metadata, so the "
            "temperature its logprobs were taken at is unknown (was it recorded by an older gateway?)"
        )
    temps = sorted({1.0 if t["temperature"] < GREEDY_EPS else float(t["temperature"]) for t in turns})
    if len(temps) > 1:
        raise TemperatureError(
            f"sample of rollout {sample.rollout_id!r} mixes temperatures {temps} in one segment: its "
            "logprobs cannot be reproduced with one temperature per row; sample a segment's turns at one"
        )
    return temps[0]


def pack_rows(rows: list[tuple[Sample, float, int]], pad_id: int = 0) -> MicroBatch:
    """Pad segments (sample, advantage, rollout index) into one micro-batch."""
    width = max(len(s.tokens) for s, _, _ in rows)
    n = len(rows)
    ids = np.full((n, width), pad_id, np.int64)
    attn = np.zeros((n, width), np.int64)
    mask = np.zeros((n, width), np.float32)
    lp = np.zeros((n, width), np.float32)
    with_teacher = all(s.teacher_log_probs is not None for s, _, _ in rows)
    teacher = np.zeros((n, width), np.float32) if with_teacher else None
    for i, (s, _, _) in enumerate(rows):
        length, start = len(s.tokens), s.prompt_length
        ids[i, :length] = s.tokens
        attn[i, :length] = 1
        mask[i, start:length] = s.loss_mask
        lp[i, start:length] = s.rollout_log_probs
        if teacher is not None:
            teacher[i, start:length] = s.teacher_log_probs
    return MicroBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask),
        rollout_log_probs=torch.from_numpy(lp),
        advantages=torch.tensor([a for _, a, _ in rows], dtype=torch.float32),
        rollout_index=torch.tensor([k for _, _, k in rows], dtype=torch.int64),
        temperature=torch.tensor([sample_temperature(s) for s, _, _ in rows], dtype=torch.float32),
        teacher_log_probs=None if teacher is None else torch.from_numpy(teacher),
        routed_experts=routing_table([s for s, _, _ in rows], width),
    )


def build_step(
    rollouts: list[Rollout], *, micro_batch_rows: int, pad_id: int = 0, advantages: bool = True,
    std_normalize: bool = True,
) -> StepBatch:  # fmt: skip
    """Advantages (unless already set: `advantages=False`), then rows packed `micro_batch_rows` at a time."""
    if micro_batch_rows < 1:
        raise ValueError("micro_batch_rows must be at least 1")
    if advantages:
        assign_advantages(rollouts, std_normalize=std_normalize)
    rows = [(seg, r.advantage, k) for k, r in enumerate(rollouts) for seg in r.segments]
    mbs = [pack_rows(rows[i : i + micro_batch_rows], pad_id) for i in range(0, len(rows), micro_batch_rows)]
    tokens = torch.tensor([r.trainable_tokens for r in rollouts], dtype=torch.int64)
    return StepBatch(micro_batches=mbs, rollout_tokens=tokens, rollouts=rollouts)
