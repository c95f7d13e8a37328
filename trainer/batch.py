"""From accepted rollouts to padded micro-batches, with the step-wide denominators the losses need.

A `Rollout` is one task run: its segments (samples sharing `rollout_id`), one reward, one group.
`build_step` assigns advantages (GRPO, per group), then packs every segment as one row into
micro-batches. Every per-token tensor is aligned to `input_ids`: position p holds what concerns
token p (its mask, its rollout logprob), which the model predicts from position p - 1; position 0
and the prompt are never trainable. How the engine took its logprobs is read from each sample's
`metadata.engine` (`gateway/engine_semantics.py`, `sample_semantics`): each row carries the
temperature the objective divides its logits by as the engine did (`sample_temperature` for
`scaled` logprobs, 1 for `raw` ones), and each micro-batch the vocabulary they were normalized over.
A step whose samples the trainers cannot reproduce, or whose engines normalized differently, is
refused before anything is trained. This module knows nothing about models or the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from rlgw.engine.sampling import GREEDY_EPS
from rlgw.gateway.engine_semantics import (
    PADDED,
    RAW,
    SCALED,
    TOKENIZER,
    EngineSemantics,
    EngineSemanticsError,
)
from rlgw.gateway.sample import Sample
from rlgw.trainer.losses import grpo_advantages
from rlgw.trainer.rollout import Rollout


class TemperatureError(EngineSemanticsError):
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
    vocabulary: str  # what the engine normalized over: PADDED (config.vocab_size) or TOKENIZER
    teacher_log_probs: Tensor | None = None  # float32, when every row has them

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


def sample_temperature(sample: Sample, greedy_below: float = GREEDY_EPS) -> float:
    """The temperature the engine's logprobs of `sample` were taken at (its turns' `turn_temperature`).

    A greedy turn (temperature below the engine's `greedy_below`) has unscaled logprobs: temperature 1. A
    segment whose turns ran at different temperatures is refused: a row is scaled by one
    temperature, and the sample does not say which tokens each turn generated.
    """
    turns = sample.metadata.get("turn_temperature")
    if not turns:
        raise TemperatureError(
            f"sample of rollout {sample.rollout_id!r} has no turn_temperature in its metadata, so the "
            "temperature its logprobs were taken at is unknown (was it recorded by an older gateway?)"
        )
    temps = sorted({1.0 if t["temperature"] < greedy_below else float(t["temperature"]) for t in turns})
    if len(temps) > 1:
        raise TemperatureError(
            f"sample of rollout {sample.rollout_id!r} mixes temperatures {temps} in one segment: its "
            "logprobs cannot be reproduced with one temperature per row; sample a segment's turns at one"
        )
    return temps[0]


def sample_semantics(sample: Sample) -> EngineSemantics:
    """How the engine took `sample`'s logprobs (its `metadata.engine`), if the trainers reproduce it.

    They reproduce `scaled` and `raw` sampled logprobs over the `padded` or the `tokenizer`
    vocabulary; anything else (vLLM's `processed_logprobs`: after top-k/top-p, renormalized; a kind
    or mode this trainer does not know) raises `EngineSemanticsError` rather than train on biased
    importance ratios.
    """
    try:
        sem = EngineSemantics.from_metadata(sample.metadata.get("engine"))
    except EngineSemanticsError as exc:
        raise EngineSemanticsError(f"sample of rollout {sample.rollout_id!r}: {exc}") from None
    if sem.logprobs not in (SCALED, RAW) or sem.vocabulary not in (PADDED, TOKENIZER):
        raise EngineSemanticsError(
            f"sample of rollout {sample.rollout_id!r} was recorded by {sem.kind} {sem.version} with "
            f"{sem.logprobs!r} logprobs over the {sem.vocabulary!r} vocabulary, which the trainers cannot "
            f"reproduce (they compute {SCALED!r} or {RAW!r} logprobs over the {PADDED!r} or {TOKENIZER!r} "
            "vocabulary; serve vLLM with --logprobs-mode raw_logprobs)"
        )
    return sem


def row_temperature(sample: Sample, sem: EngineSemantics) -> float:
    """What the objective divides `sample`'s logits by: its sampling temperature where the engine
    scaled its logprobs, 1 where they are the raw model's."""
    return 1.0 if sem.logprobs == RAW else sample_temperature(sample, sem.greedy_below)


def step_vocabulary(samples: list[Sample]) -> str:
    """The one normalization every sample of a step shares (`EngineSemanticsError` if they differ).

    One step trains on one engine's semantics: samples from engines that normalized differently
    (kind, sampled logprobs, vocabulary) are refused together rather than mixed.
    """
    seen: dict[tuple[str, str, str], str] = {}
    for s in samples:
        sem = sample_semantics(s)
        seen.setdefault((sem.kind, sem.logprobs, sem.vocabulary), s.rollout_id)
    if len(seen) > 1:
        found = "; ".join(
            f"{k} {lp} logprobs over the {v} vocabulary (rollout {r!r})" for (k, lp, v), r in seen.items()
        )
        raise EngineSemanticsError(
            f"the step mixes engine logprob semantics: {found}; train on one engine's samples"
        )
    return next(iter(seen))[2] if seen else PADDED


def pack_rows(rows: list[tuple[Sample, float, int]], vocabulary: str, pad_id: int = 0) -> MicroBatch:
    """Pad segments (sample, advantage, rollout index) into one micro-batch whose logprobs were
    normalized over `vocabulary` (`step_vocabulary`)."""
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
        temperature=torch.tensor(
            [row_temperature(s, sample_semantics(s)) for s, _, _ in rows], dtype=torch.float32
        ),
        vocabulary=vocabulary,
        teacher_log_probs=None if teacher is None else torch.from_numpy(teacher),
    )


def build_step(
    rollouts: list[Rollout], *, micro_batch_rows: int, pad_id: int = 0, advantages: bool = True,
    std_normalize: bool = True,
) -> StepBatch:  # fmt: skip
    """Advantages (unless already set: `advantages=False`), then rows packed `micro_batch_rows` at a time
    (`EngineSemanticsError` first if the trainers cannot reproduce the samples' logprobs)."""
    if micro_batch_rows < 1:
        raise ValueError("micro_batch_rows must be at least 1")
    if advantages:
        assign_advantages(rollouts, std_normalize=std_normalize)
    rows = [(seg, r.advantage, k) for k, r in enumerate(rollouts) for seg in r.segments]
    vocabulary = step_vocabulary([seg for seg, _, _ in rows])
    mbs = [
        pack_rows(rows[i : i + micro_batch_rows], vocabulary, pad_id)
        for i in range(0, len(rows), micro_batch_rows)
    ]
    tokens = torch.tensor([r.trainable_tokens for r in rollouts], dtype=torch.int64)
    return StepBatch(micro_batches=mbs, rollout_tokens=tokens, rollouts=rollouts)
