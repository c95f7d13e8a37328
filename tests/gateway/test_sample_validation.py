"""The hand-off contract: one malformed sample per reject reason, each refused with its own reason.

A trainer trusts a sample because the gateway validated it, so every check in `validate_sample`
has a sample here that only that check refuses (and a valid neighbour that it lets through).
`capture_invalid` is not a property of a sample: the finish path gives it to every segment of a
passthrough session (tests/gateway/test_api.py, the passthrough policy test).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rlgw.gateway.sample import (
    RejectReason,
    RoutingShape,
    Sample,
    SampleRejected,
    SampleStatus,
    VersionSpan,
    validate_sample,
)

VOCAB = 1000
PROMPT = [11, 12, 13, 14]
# Response: 3 sampled tokens, 2 tool-observation tokens (mask 0), 2 sampled tokens.
RESPONSE = [21, 22, 23, 31, 32, 24, 25]
MASK = [1, 1, 1, 0, 0, 1, 1]
LOGPROBS = [-0.1, -2.0, -0.5, 0.0, 0.0, -1.5, -0.01]


def sample(**change: Any) -> Sample:
    """A valid sample (two weight versions, a tool observation), with `change` applied."""
    fields: dict[str, Any] = {
        "tokens": np.asarray(PROMPT + RESPONSE, dtype=np.int32),
        "response_length": len(RESPONSE),
        "loss_mask": np.asarray(MASK, dtype=np.uint8),
        "rollout_log_probs": np.asarray(LOGPROBS, dtype=np.float32),
        "reward": 1.0,
        "status": SampleStatus.COMPLETED,
        "rollout_id": "r-1",
        "group_index": 0,
        "weight_versions": [VersionSpan("v1", 0, 5), VersionSpan("v2", 5, 7)],
    }
    fields.update(change)
    return Sample(**fields)


def rejected(s: Sample, vocab_size: int | None = VOCAB) -> RejectReason:
    with pytest.raises(SampleRejected) as err:
        validate_sample(s, vocab_size)
    assert str(err.value).startswith(f"{err.value.reason}: ")
    return err.value.reason


def with_logprob(at: int, value: float) -> Sample:
    lp = np.asarray(LOGPROBS, dtype=np.float32)
    lp[at] = value
    return sample(rollout_log_probs=lp)


def test_the_valid_sample_passes_with_and_without_a_vocabulary() -> None:
    validate_sample(sample(), VOCAB)
    validate_sample(sample(), None)
    validate_sample(sample(reward=None))  # not scored yet is allowed
    validate_sample(sample(reward=-3.5))


def test_the_smallest_valid_samples() -> None:
    # One prompt token and one sampled token; token id 0 is a real id.
    one = sample(
        tokens=np.asarray([0, 0], dtype=np.int32),
        response_length=1,
        loss_mask=np.ones(1, dtype=np.uint8),
        rollout_log_probs=np.asarray([-0.5], dtype=np.float32),
        weight_versions=[VersionSpan("v1", 0, 1)],
    )
    validate_sample(one, VOCAB)


@pytest.mark.parametrize(
    "change",
    [
        {"response_length": 0},
        {"tokens": np.asarray(RESPONSE, dtype=np.int32)},  # no prompt before the response
        {"tokens": np.asarray(RESPONSE[:5], dtype=np.int32)},  # fewer tokens than the response
        {"loss_mask": np.zeros(len(RESPONSE), dtype=np.uint8)},  # nothing to train on
    ],
    ids=["no-response", "no-prompt", "short-tokens", "no-trainable-token"],
)
def test_empty(change: dict[str, Any]) -> None:
    assert rejected(sample(**change)) is RejectReason.EMPTY


@pytest.mark.parametrize(
    "change",
    [
        {"loss_mask": np.asarray(MASK[:-2], dtype=np.uint8)},
        {"loss_mask": np.asarray([*MASK, 1], dtype=np.uint8)},
        {"rollout_log_probs": np.asarray(LOGPROBS[:-1], dtype=np.float32)},
        {"rollout_log_probs": np.asarray([*LOGPROBS, -0.3], dtype=np.float32)},
    ],
    ids=["mask-short", "mask-long", "logprobs-short", "logprobs-long"],
)
def test_length_mismatch_is_a_reject_not_an_index_error(change: dict[str, Any]) -> None:
    # A mask shorter than the response would make the logprob check index out of bounds:
    # the length check must come first and name the problem.
    assert rejected(sample(**change)) is RejectReason.LENGTH_MISMATCH


def test_bad_mask_values_and_a_response_that_starts_on_an_observation() -> None:
    two = np.asarray(MASK, dtype=np.uint8)
    two[1] = 2
    assert rejected(sample(loss_mask=two)) is RejectReason.BAD_MASK
    starts_on_observation = np.asarray([0, *MASK[1:]], dtype=np.uint8)
    assert rejected(sample(loss_mask=starts_on_observation)) is RejectReason.BAD_MASK


@pytest.mark.parametrize("value", [0.7, 1e-3, math.nan, math.inf, -math.inf])
def test_bad_logprob_on_a_trainable_token(value: float) -> None:
    assert rejected(with_logprob(1, value)) is RejectReason.BAD_LOGPROB
    assert rejected(with_logprob(6, value)) is RejectReason.BAD_LOGPROB  # the last sampled token too


def test_logprobs_are_only_checked_where_the_mask_is_one() -> None:
    # Observation positions carry no logprob; whatever sits there is not the engine's.
    validate_sample(with_logprob(3, 0.7))
    validate_sample(with_logprob(4, math.nan))
    # A logprob of exactly 0 (a certain token) is a valid logprob.
    validate_sample(with_logprob(0, 0.0))


def test_bad_token_ids() -> None:
    tokens = np.asarray(PROMPT + RESPONSE, dtype=np.int32)
    negative = tokens.copy()
    negative[0] = -1
    assert rejected(sample(tokens=negative)) is RejectReason.BAD_TOKEN
    assert rejected(sample(tokens=negative), None) is RejectReason.BAD_TOKEN
    at_vocab = tokens.copy()
    at_vocab[-1] = VOCAB  # one past the last id
    assert rejected(sample(tokens=at_vocab)) is RejectReason.BAD_TOKEN
    validate_sample(sample(tokens=at_vocab), VOCAB + 1)  # the last id itself is fine
    validate_sample(sample(tokens=at_vocab), None)  # no vocabulary: only negatives are wrong


@pytest.mark.parametrize(
    "spans",
    [
        [],
        [VersionSpan("v1", 0, 5)],  # stops short of the response's end
        [VersionSpan("v1", 0, 5), VersionSpan("v2", 5, 8)],  # runs past it
        [VersionSpan("v1", 1, 5), VersionSpan("v2", 5, 7)],  # does not start at 0
        [VersionSpan("v1", 0, 4), VersionSpan("v2", 5, 7)],  # a gap
        [VersionSpan("v1", 0, 5), VersionSpan("v2", 4, 7)],  # an overlap
        [VersionSpan("v1", 0, 5), VersionSpan("v2", 5, 5), VersionSpan("v3", 5, 7)],  # an empty span
        [VersionSpan("v1", 0, 7), VersionSpan("v2", 7, 6)],  # a backwards span
    ],
    ids=["none", "short", "long", "late-start", "gap", "overlap", "empty", "backwards"],
)
def test_version_spans_must_tile_the_response(spans: list[VersionSpan]) -> None:
    assert rejected(sample(weight_versions=spans)) is RejectReason.VERSION_SPANS


def test_one_span_over_the_whole_response_is_valid() -> None:
    validate_sample(sample(weight_versions=[VersionSpan("v1", 0, len(RESPONSE))]))


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_has_its_own_reason(reward: float) -> None:
    assert rejected(sample(reward=reward)) is RejectReason.BAD_REWARD


def assert_same(got: Sample, want: Sample) -> None:
    for name in ("tokens", "loss_mask", "rollout_log_probs", *TEACHER):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
    for name in ("response_length", "reward", "status", "rollout_id", "group_index", "weight_versions"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.metadata == want.metadata


TEACHER = ("teacher_log_probs", "teacher_topk_indices", "teacher_topk_logprobs")


def test_the_wire_form_round_trips_with_and_without_teacher_fields() -> None:
    plain = sample(group_index=3, metadata={"segment": 1}, status=SampleStatus.TRUNCATED, reward=None)
    doc = plain.to_dict()
    assert isinstance(doc["tokens"], list) and doc["status"] == "truncated" and doc["group_index"] == 3
    assert doc["weight_versions"] == [
        {"version": "v1", "start": 0, "end": 5},
        {"version": "v2", "start": 5, "end": 7},
    ]
    assert not set(TEACHER) & set(doc)  # absent teacher fields are left out, not null
    assert_same(Sample.from_dict(doc), plain)

    k = 2
    teacher = sample(
        teacher_log_probs=np.linspace(-1, 0, len(RESPONSE), dtype=np.float32),
        teacher_topk_indices=np.arange(len(RESPONSE) * k, dtype=np.int32).reshape(-1, k),
        teacher_topk_logprobs=-np.ones((len(RESPONSE), k), dtype=np.float32),
    )
    arrays = teacher.to_dict(numpy=True)
    assert all(isinstance(arrays[n], np.ndarray) for n in ("tokens", "loss_mask", *TEACHER))
    assert_same(Sample.from_dict(teacher.to_dict()), teacher)
    # A minimal document (no group index, spans, metadata or teacher fields) gets the defaults.
    minimal = {
        k: v for k, v in plain.to_dict().items() if k not in ("group_index", "weight_versions", "metadata")
    }
    got = Sample.from_dict(minimal)
    assert (got.group_index, got.weight_versions, got.metadata) == (0, [], {})


def test_every_reason_that_validate_sample_gives_has_a_test_here() -> None:
    # capture_invalid is the finish path's, for passthrough sessions (see the module docstring).
    tested = {
        RejectReason.EMPTY,
        RejectReason.LENGTH_MISMATCH,
        RejectReason.BAD_MASK,
        RejectReason.BAD_LOGPROB,
        RejectReason.BAD_TOKEN,
        RejectReason.VERSION_SPANS,
        RejectReason.BAD_REWARD,
        RejectReason.BAD_ROUTING,
    }
    assert set(RejectReason) - tested == {RejectReason.CAPTURE_INVALID}


MOE = RoutingShape(layers=3, top_k=2, experts=8)


def routed(rows: int = len(PROMPT) + len(RESPONSE) - 1, shape: tuple[int, ...] = (3, 2)) -> np.ndarray:
    return (np.arange(rows * int(np.prod(shape))) % MOE.experts).astype(np.uint8).reshape(rows, *shape)


@pytest.mark.parametrize(
    "bad",
    [
        routed(rows=len(PROMPT) + len(RESPONSE)),  # a row for the last token, which is never fed
        routed(shape=(2, 2)),  # a layer short
        routed(shape=(3, 3)),  # top-3 of a top-2 model
        routed().reshape(-1, 6),  # not [tokens, layers, top_k]
        np.where(routed() == 0, MOE.experts, routed()).astype(np.uint8),  # expert 8 of 0..7
        routed().astype(np.int16) - 1,  # a negative id
    ],
    ids=["rows", "layers", "top_k", "rank", "expert-range", "negative"],
)
def test_routed_experts_that_do_not_fit_the_model_are_refused(bad: np.ndarray) -> None:
    validate_sample(sample(rollout_routed_experts=routed()), VOCAB, MOE)
    with pytest.raises(SampleRejected) as err:
        validate_sample(sample(rollout_routed_experts=bad), VOCAB, MOE)
    assert err.value.reason is RejectReason.BAD_ROUTING


def test_routed_experts_round_trip_compact() -> None:
    s = sample(rollout_routed_experts=routed())
    back = Sample.from_dict(s.to_dict())
    assert back.rollout_routed_experts.dtype == np.uint8
    assert np.array_equal(back.rollout_routed_experts, s.rollout_routed_experts)
    wide = sample(rollout_routed_experts=routed().astype(np.int16) + 250)  # ids past 255
    assert Sample.from_dict(wide.to_dict()).rollout_routed_experts.dtype == np.int16
