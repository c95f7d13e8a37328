"""The training objective of one micro-batch, from a model's logits: what every trainer backend shares.

policy loss (PPO clip on the ratio to the old policy, optionally truncated-IS corrected) + kl_coef *
K3(pi || teacher or reference) - entropy_coef * entropy, each reduced with the step-wide token
weights (`losses.token_weights`), so micro-batch losses and their gradients add up to the step's.
Backends (PyTorch, Megatron) only produce logits and apply the optimizer; this module owns the math.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlgw.gateway.engine_semantics import PADDED, TOKENIZER
from rlgw.trainer import losses
from rlgw.trainer.batch import MicroBatch
from rlgw.trainer.settings import LossConfig


def engine_logits(logits: Tensor, temperature: Tensor, columns: int) -> Tensor:
    """The logits the engine's logprobs were taken from: `log_softmax` of this equals the engine's.

    `columns`: how many ids the engine normalized over (`vocab_columns`: the model's whole
    `config.vocab_size`, padded ids included, as SGLang, vLLM and the embedded engine do; or the
    tokenizer's); a Megatron model's own padding past `config.vocab_size` is always cut.
    `temperature` ([rows]): what the engine divided each row by (1 for raw logprobs).
    """
    out = logits[..., :columns].float()
    if bool((temperature == 1.0).all()):
        return out
    return out / temperature.to(out.device, out.dtype)[:, None, None]


def vocab_columns(model_vocab: int, tokenizer_vocab: int) -> dict[str, int]:
    """The columns of the model's logits each engine vocabulary (`MicroBatch.vocabulary`) covers."""
    return {PADDED: model_vocab, TOKENIZER: min(tokenizer_vocab, model_vocab)}


def token_log_probs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """log pi(token p | tokens < p) at every position p >= 1, aligned to `input_ids` (0.0 at p = 0)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def shifted_entropy(logits: Tensor) -> Tensor:
    """Entropy of the distribution that predicted each token, aligned like `token_log_probs`."""
    return torch.nn.functional.pad(losses.entropy_from_logits(logits[:, :-1]), (1, 0))


def micro_batch_loss(
    logits: Tensor,
    mb: MicroBatch,
    rollout_tokens: Tensor,
    cfg: LossConfig,
    *,
    old_log_probs: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and its additive metrics (sums over the step add up).

    `old_log_probs` is needed when `cfg.old_log_probs == "recompute"`; `ref_log_probs` when the KL
    source is the reference model.
    """
    weights = losses.token_weights(mb.loss_mask, mb.rollout_index, rollout_tokens, cfg.reduction)
    logp = token_log_probs(logits, mb.input_ids)
    adv = mb.advantages[:, None].expand_as(logp)
    if cfg.old_log_probs == "recompute":
        if old_log_probs is None:
            raise ValueError("old_log_probs='recompute' needs the trainer's logprobs before the update")
        old = old_log_probs.detach()
    else:
        old = mb.rollout_log_probs
    pg, clipped = losses.ppo_policy_loss(
        logp, old, adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
    )
    if cfg.tis_cap is not None and cfg.old_log_probs == "recompute":
        pg = pg * losses.truncated_is_weights(old, mb.rollout_log_probs, cfg.tis_cap)
    pg_loss = losses.weighted_sum(pg, weights)
    total = pg_loss
    metrics: dict[str, float] = {"pg_loss": float(pg_loss.detach())}
    if cfg.kl_coef:
        ref = mb.teacher_log_probs if cfg.kl_source == "teacher" else ref_log_probs
        if ref is None:
            raise ValueError(
                f"kl_coef > 0 with kl_source={cfg.kl_source!r} but no such logprobs in the batch"
            )
        kl = losses.weighted_sum(losses.k3_kl(logp, ref), weights)
        total = total + cfg.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if cfg.entropy_coef:
        ent = losses.weighted_sum(shifted_entropy(logits), weights)
        total = total - cfg.entropy_coef * ent
        metrics["entropy"] = float(ent.detach())
    with torch.no_grad():
        ratio = losses.importance_ratio(logp, mb.rollout_log_probs)
        on = mb.loss_mask > 0
        metrics["clipfrac"] = float(losses.weighted_sum(clipped, weights))
        metrics["ratio_mean"] = float(losses.weighted_sum(ratio, weights))
        gap = (logp - mb.rollout_log_probs).abs()[on]
        metrics["logprob_gap_max"] = float(gap.max()) if gap.numel() else 0.0
    metrics["loss"] = float(total.detach())
    return total, metrics


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Step metrics from micro-batch ones: sums, except `logprob_gap_max` (a max)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = max(out.get(k, 0.0), v) if k == "logprob_gap_max" else out.get(k, 0.0) + v
    return out
