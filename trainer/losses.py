"""RL losses as plain functions on tensors: advantages, policy loss, importance weights, KL, entropy.

Every function takes per-token tensors of one shape (any shape; typically [batch, tokens]) and returns
per-token terms or scalars; none of them knows about samples, models or micro-batches. Reduction to one
scalar is explicit (`token_weights` + `weighted_sum`): the weights are computed once per optimizer step over
the whole step, so a loss summed over micro-batches equals the loss of the step in one piece, and one
rollout split into segments (in different micro-batches or not) counts exactly like the unsplit rollout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlgw.trainer.settings import Reduction


def grpo_advantages(
    rewards: Tensor, groups: Tensor, *, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages: (r - group mean) / (unbiased group std + eps), or r - mean.

    `rewards` and `groups` are 1-D, one entry per rollout; `groups` holds integer group ids. A group
    of one rollout (no std) or with equal rewards gets advantage 0 (it carries no relative signal).
    """
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must be equal 1-D")
    rewards = rewards.to(torch.float64)
    out = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        idx = groups == g
        r = rewards[idx]
        centered = r - r.mean()
        if std_normalize:
            std = r.std(unbiased=True) if r.numel() > 1 else r.new_zeros(())
            # centered is exactly 0 when std is 0, so eps = 0 must not turn it into NaN
            centered = centered / (std + eps) if float(std + eps) > 0 else centered
        out[idx] = centered
    return out.to(torch.float32)


def importance_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    """pi_theta / pi_old per token, from log-probabilities (1 where they agree)."""
    return torch.exp(log_probs - old_log_probs)


def ppo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate per token, and which tokens were clipped (as 0/1 floats).

    The ratio is clipped to [1 - clip_low, 1 + clip_high] (asymmetric when they differ, as in DAPO's
    clip-higher). `dual_clip` = c > 1 bounds the loss of negative-advantage tokens by -c * A, so one
    token whose ratio exploded cannot dominate the step.
    """
    ratio = importance_ratio(log_probs, old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).float()
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, was_clipped


def truncated_is_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, cap: float = 2.0) -> Tensor:
    """Truncated importance sampling: min(pi_old / pi_rollout, cap) per token, without gradient.

    Corrects for tokens sampled by the engine under a policy other than the trainer's `old` one
    (an older version, or numerics that differ between engine and trainer); the cap bounds variance.
    """
    return torch.exp(old_log_probs - rollout_log_probs).clamp(max=cap).detach()


def k3_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_log_probs - log_probs
    # expm1 keeps the near-zero case exact: exp(d) - 1 - d rounds below 0 when pi ~ ref.
    return torch.expm1(d) - d


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dimension, per position."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_weights(
    mask: Tensor, rollout_index: Tensor, rollout_tokens: Tensor, reduction: Reduction | str
) -> Tensor:
    """Per-token weights whose weighted sum is the step's loss.

    `mask`: 0/1 trainable tokens of this micro-batch. `rollout_index`: per row (segment), which
    rollout of the step it belongs to. `rollout_tokens`: per rollout of the whole step, its trainable
    tokens over all its segments and micro-batches. Both denominators are step-wide, so weights do
    not depend on how segments were split or packed.
    """
    mask = mask.float()
    reduction = Reduction(reduction)
    n_rollouts = rollout_tokens.numel()
    if reduction is Reduction.PER_ROLLOUT_MEAN:
        denom = rollout_tokens.to(mask.dtype)[rollout_index].clamp(min=1.0) * n_rollouts
        shape = (-1,) + (1,) * (mask.dim() - 1)
        return mask / denom.view(shape)
    return mask / rollout_tokens.sum().to(mask.dtype).clamp(min=1.0)


def weighted_sum(values: Tensor, weights: Tensor) -> Tensor:
    """sum(values * weights), with masked positions contributing exactly zero (also their gradient)."""
    return torch.where(weights != 0, values * weights, values.new_zeros(())).sum()
