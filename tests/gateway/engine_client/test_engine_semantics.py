"""Every sample says how its engine took its logprobs and whether its seeds hold (`metadata.engine`).

One shape for every engine kind (`gateway/engine_semantics.py`), filled at start-up from the server's
own info; a user whose engine ignores seeds is warned at start-up and by `rlgw train`.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rlgw.gateway.app import _warn_if_seeds_ignored
from rlgw.gateway.engine_client.vllm_backend import engine_semantics
from rlgw.gateway.engine_semantics import EngineSemantics, EngineSemanticsError, sglang_semantics
from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.client import StoredTrajectory
from rlgw.trainer.loop import not_repeatable

# What SGLang 0.5.23's /server_info says on CPU (flattened server args; abridged).
SGLANG_INFO = {
    "version": "0.5.23",
    "enable_deterministic_inference": False,
    "dtype": "float32",
    "device": "cpu",
}


def test_sglang_without_deterministic_inference_does_not_honour_seeds() -> None:
    sem = sglang_semantics(SGLANG_INFO)
    assert (sem.kind, sem.version, sem.logprobs, sem.forced_logprobs, sem.vocabulary) == (
        "sglang", "0.5.23", "scaled", "raw", "padded"
    )  # fmt: skip
    assert sem.seed_honoured is False
    assert "--enable-deterministic-inference" in (sem.not_repeatable_reason() or "")
    assert sglang_semantics({**SGLANG_INFO, "enable_deterministic_inference": True}).seed_honoured
    unknown = sglang_semantics(None)  # a router that does not answer /server_info
    assert not unknown.seed_honoured and unknown.to_metadata()["server_info_reported"] is False


def test_the_embedded_engine_and_vllm_are_described_in_the_same_shape() -> None:
    embedded = sglang_semantics({"version": "rlgw-engine 0.1.0", "enable_deterministic_inference": True})
    assert (embedded.kind, embedded.version, embedded.seed_honoured) == ("rlgw-engine", "0.1.0", True)
    original = sglang_semantics({"version": "rlgw-engine 0.1.0", "return_original_logprob": True})
    assert original.logprobs == "raw"
    vllm = engine_semantics("0.32.0", "raw_logprobs")
    assert set(vllm.to_metadata()) >= set(embedded.to_metadata())
    assert (vllm.logprobs, vllm.vocabulary, vllm.seed_honoured) == ("raw", "padded", True)
    for sem in (embedded, vllm):
        assert EngineSemantics.from_metadata(sem.to_metadata()) == sem
    with pytest.raises(EngineSemanticsError, match=r"no metadata\.engine"):
        EngineSemantics.from_metadata(None)


def test_start_up_warns_when_the_engine_ignores_seeds(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        _warn_if_seeds_ignored(sglang_semantics({**SGLANG_INFO, "enable_deterministic_inference": True}))
        assert not caplog.records
        _warn_if_seeds_ignored(sglang_semantics(SGLANG_INFO))
    (record,) = caplog.records
    assert record.getMessage() == "the engine ignores sampling seeds"


def _stored(engine: dict) -> StoredTrajectory:
    ids, one, lp, meta = (
        np.arange(4, dtype=np.int32),
        np.ones(1, np.uint8),
        np.full(1, -1.0, np.float32),
        {"engine": engine},
    )
    sample = Sample(ids, 1, one, lp, 1.0, SampleStatus.COMPLETED, "r0", 0, [VersionSpan("0", 0, 1)], meta)
    return StoredTrajectory(0, "s", "t", 0, 0.0, sample)


def test_train_receipts_say_a_run_on_an_engine_ignoring_seeds_is_not_repeatable() -> None:
    honoured = _stored(
        sglang_semantics({**SGLANG_INFO, "enable_deterministic_inference": True}).to_metadata()
    )
    assert not_repeatable([honoured]) is None
    ignored = _stored(sglang_semantics(SGLANG_INFO).to_metadata())
    assert "not repeatable" in (not_repeatable([honoured, ignored]) or "")
