"""Each loss against hand-computed values; reduction across segments and micro-batches; zero gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.trainer import losses
from rlgw.trainer.batch import Rollout, build_step
from rlgw.trainer.losses import Reduction
from rlgw.trainer.objective import LossConfig, micro_batch_loss, token_log_probs
from tests.trainer.support import sampled_at


def test_grpo_advantages_group_mean_unbiased_std_and_mean_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])
    adv = losses.grpo_advantages(rewards, groups, eps=0.0)
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    want = 0.5 / math.sqrt(1 / 3)
    assert adv[:4].tolist() == pytest.approx([want, -want, -want, want], rel=1e-6)
    assert adv[4:8].tolist() == [0.0] * 4  # equal rewards: no relative signal
    assert adv[8].item() == 0.0  # a group of one
    mean_only = losses.grpo_advantages(rewards, groups, std_normalize=False)
    assert mean_only[:4].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    eps = losses.grpo_advantages(rewards[:4], groups[:4], eps=0.1)
    assert eps[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1), rel=1e-6)


def test_ppo_clip_asymmetric_and_dual_clip() -> None:
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 5.0])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    logp, old = torch.log(ratio), torch.zeros(5)
    loss, clipped = losses.ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 0.8, 5.0], rel=1e-6)
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    hi, _ = losses.ppo_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    assert hi[0].item() == pytest.approx(-1.28, rel=1e-6)
    lo, _ = losses.ppo_policy_loss(logp, old, adv, clip_low=0.1, clip_high=0.28)
    assert lo[3].item() == pytest.approx(0.9, rel=1e-6)  # A < 0, ratio 0.5 clipped up to 0.9
    dual, _ = losses.ppo_policy_loss(logp, old, adv, dual_clip=3.0)
    assert dual.tolist() == pytest.approx([-1.2, 1.5, -0.5, 0.8, 3.0], rel=1e-6)  # -c * A caps the last
    with pytest.raises(ValueError):
        losses.ppo_policy_loss(logp, old, adv, dual_clip=1.0)


def test_importance_ratio_is_one_when_logprobs_agree_and_tis_truncates() -> None:
    lp = -torch.rand(100) * 5
    assert torch.equal(losses.importance_ratio(lp, lp.clone()), torch.ones(100))
    w = losses.truncated_is_weights(
        torch.log(torch.tensor([0.5, 0.2])), torch.log(torch.tensor([0.25, 0.4])), 1.5
    )
    assert w.tolist() == pytest.approx([1.5, 0.5], rel=1e-6)  # 2.0 capped at 1.5; 0.5 kept


def test_k3_and_entropy_hand_values() -> None:
    logp, ref = torch.log(torch.tensor([0.5, 0.3])), torch.log(torch.tensor([0.25, 0.3]))
    kl = losses.k3_kl(logp, ref)
    assert kl[0].item() == pytest.approx(0.5 + math.log(2) - 1, rel=1e-6)
    assert kl[1].item() == 0.0
    assert losses.entropy_from_logits(torch.zeros(3, 8)).tolist() == pytest.approx([math.log(8)] * 3)
    p = torch.tensor([0.7, 0.2, 0.1])
    assert losses.entropy_from_logits(p.log())[()].item() == pytest.approx(
        -(p * p.log()).sum().item(), rel=1e-6
    )


def test_per_rollout_mean_shares_one_denominator_across_segments() -> None:
    # rollout 0 has token terms [1, 3, 5, 7] in two segments, rollout 1 has [10]
    values = torch.tensor([[1.0, 3.0], [5.0, 7.0], [10.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    index = torch.tensor([0, 0, 1])
    tokens = torch.tensor([4, 1])
    w = losses.token_weights(mask, index, tokens, Reduction.PER_ROLLOUT_MEAN)
    assert losses.weighted_sum(values, w).item() == pytest.approx((4.0 + 10.0) / 2)
    # the same rows as separate micro-batches add up to the same loss
    split = sum(
        losses.weighted_sum(
            values[i : i + 1],
            losses.token_weights(mask[i : i + 1], index[i : i + 1], tokens, "per_rollout_mean"),
        )
        for i in range(3)
    )
    assert float(split) == pytest.approx(7.0)
    w_tok = losses.token_weights(mask, index, tokens, Reduction.PER_TOKEN)
    assert losses.weighted_sum(values, w_tok).item() == pytest.approx(26.0 / 5)


def _sample(tokens: list[int], prompt: int, mask: list[int], lps: list[float], rid: str) -> Sample:
    n = len(tokens) - prompt
    return Sample(
        tokens=np.asarray(tokens, np.int32),
        response_length=n,
        loss_mask=np.asarray(mask, np.uint8),
        rollout_log_probs=np.asarray(lps, np.float32),
        reward=1.0,
        status=SampleStatus.COMPLETED,
        rollout_id=rid,
        group_index=0,
        weight_versions=[VersionSpan("1", 0, n)],
        metadata=sampled_at(),
    )


class TinyLM(torch.nn.Module):
    """A causal LM small enough to reason about: embedding -> causal mean of previous tokens -> logits."""

    def __init__(self, vocab: int = 32, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).cumsum(1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]
        return self.out(torch.tanh(h))


def _step_loss_and_grads(model: TinyLM, rollouts: list[Rollout], rows: int, cfg: LossConfig):
    model.zero_grad()
    step = build_step(rollouts, micro_batch_rows=rows, advantages=False)
    total = 0.0
    for mb in step.micro_batches:
        loss, _ = micro_batch_loss(model(mb.input_ids), mb, step.rollout_tokens, cfg)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("reduction", ["per_rollout_mean", "per_token"])
def test_split_rollout_equals_unsplit_in_loss_and_gradients(reduction: str) -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 32, 14).tolist()
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 1, 1]  # 10 response tokens after a 4-token prompt; tool gaps are 0
    lps = [float(-rng.random()) if m else 0.0 for m in mask]
    whole = _sample(tokens, 4, mask, lps, "a")
    # the same run as two segments: the second's prompt is everything before its first generated token
    seg1 = _sample(tokens[:9], 4, mask[:5], lps[:5], "a")
    seg2 = _sample(tokens, 9, mask[5:], lps[5:], "a")
    other = _sample(rng.integers(1, 32, 8).tolist(), 3, [1, 1, 0, 1, 1], [-0.5, -0.2, 0.0, -1.0, -0.1], "b")
    cfg = LossConfig(reduction=Reduction(reduction))
    model = TinyLM()

    def rollouts(segments: list[Sample]) -> list[Rollout]:
        return [Rollout("a", 0, 1.0, segments, advantage=0.7), Rollout("b", 0, 0.0, [other], advantage=-0.7)]

    loss_a, grads_a = _step_loss_and_grads(model, rollouts([whole]), rows=8, cfg=cfg)
    # segments of rollout "a" land in different micro-batches (one row each)
    loss_b, grads_b = _step_loss_and_grads(model, rollouts([seg1, seg2]), rows=1, cfg=cfg)
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5, atol=1e-7)


def test_masked_tool_tokens_get_exactly_zero_gradient() -> None:
    tokens = list(range(1, 13))
    mask = [1, 1, 0, 0, 0, 1, 1, 1]  # 3 tool-observation tokens in the response
    lps = [-0.3, -0.2, 0.0, 0.0, 0.0, -0.9, -0.4, -0.1]
    rollout = Rollout("a", 0, 1.0, [_sample(tokens, 4, mask, lps, "a")], advantage=1.3)
    step = build_step([rollout], micro_batch_rows=1, advantages=False)
    mb = step.micro_batches[0]
    logits = torch.randn(1, 12, 16, requires_grad=True)
    cfg = LossConfig(kl_coef=0.1, kl_source="teacher", entropy_coef=0.01)
    mb.teacher_log_probs = -torch.rand(1, 12)
    loss, _ = micro_batch_loss(logits, mb, step.rollout_tokens, cfg)
    loss.backward()
    # position p's token is predicted by logits[p - 1]; the response starts at position 4
    grad_rows = logits.grad[0].abs().sum(-1)
    for i, m in enumerate(mask):
        predicting = 4 + i - 1
        assert (grad_rows[predicting] > 0) if m else (grad_rows[predicting] == 0), (i, m)
    assert torch.all(grad_rows[:3] == 0) and grad_rows[11] == 0  # prompt and the last position: nothing
    # and what the masked positions hold cannot leak in: garbage there changes nothing
    logits.grad = None
    mb.rollout_log_probs[0, 6:9] = -50.0
    mb.teacher_log_probs[0, 6:9] = -50.0
    loss2, _ = micro_batch_loss(logits, mb, step.rollout_tokens, cfg)
    loss2.backward()
    assert float(loss2) == float(loss)
    assert torch.equal(logits.grad[0].abs().sum(-1), grad_rows)


def test_ratio_is_one_and_gradient_is_plain_policy_gradient_when_on_policy() -> None:
    model = TinyLM()
    ids = torch.randint(1, 32, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lp = token_log_probs(model(ids), ids)[0]
    mask = [1] * 6
    s = _sample(ids[0].tolist(), 4, mask, lp[4:].tolist(), "a")
    step = build_step([Rollout("a", 0, 1.0, [s], advantage=2.0)], micro_batch_rows=1, advantages=False)
    mb = step.micro_batches[0]
    loss, metrics = micro_batch_loss(model(mb.input_ids), mb, step.rollout_tokens, LossConfig())
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clipfrac"] == 0.0
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (-(2.0 * token_log_probs(model(ids), ids)[0, 4:]).mean()).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-7)
