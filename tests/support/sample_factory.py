"""Realistic samples for store, API, client and CLI tests: prompt + response with tool-observation gaps."""

from __future__ import annotations

import numpy as np

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan, validate_sample


def make_sample(
    rng: np.random.Generator,
    *,
    prompt: int = 40,
    response: int = 60,
    teacher_k: int = 0,
    reward: float | None = 1.0,
    rollout_id: str = "r-1",
    metadata: dict | None = None,
) -> Sample:
    """A valid sample: generated chunks (mask 1, negative logprobs) between observations (mask 0)."""
    mask = np.zeros(response, np.uint8)
    pos = 0
    while pos < response:
        gen = int(rng.integers(3, 12))
        mask[pos : pos + gen] = 1
        pos += gen + int(rng.integers(2, 9))
    logprobs = np.where(mask == 1, -rng.exponential(0.4, response), 0.0).astype(np.float32)
    half = response // 2
    sample = Sample(
        tokens=rng.integers(0, 151_000, prompt + response, dtype=np.int32),
        response_length=response,
        loss_mask=mask,
        rollout_log_probs=logprobs,
        reward=reward,
        status=SampleStatus.COMPLETED,
        rollout_id=rollout_id,
        group_index=int(rng.integers(0, 8)),
        weight_versions=[VersionSpan("v1", 0, half), VersionSpan("v2", half, response)],
        metadata=metadata if metadata is not None else {"termination_reason": "stop", "tool_errors": []},
    )
    if teacher_k:
        sample.teacher_log_probs = -rng.random(response, dtype=np.float32)
        sample.teacher_topk_indices = rng.integers(0, 151_000, (response, teacher_k), dtype=np.int32)
        sample.teacher_topk_logprobs = -rng.random((response, teacher_k), dtype=np.float32)
    validate_sample(sample)
    return sample


def assert_same_sample(got: Sample, want: Sample) -> None:
    """Token-exact equality of every field, dtypes included."""
    for name in ("tokens", "loss_mask", "rollout_log_probs"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    for name in ("teacher_log_probs", "teacher_topk_indices", "teacher_topk_logprobs"):
        g, w = getattr(got, name), getattr(want, name)
        if w is None:
            assert g is None, name
        else:
            assert g is not None and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
    assert got.response_length == want.response_length
    assert got.reward == want.reward
    assert got.status == want.status
    assert got.rollout_id == want.rollout_id
    assert got.group_index == want.group_index
    assert got.weight_versions == want.weight_versions
    assert got.metadata == want.metadata
