"""The engine client against an engine that fails on cue (real HTTP, injected faults)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlgw.gateway.backend import SGLangBackend
from rlgw.gateway.errors import InvalidRequest, UpstreamAborted, UpstreamError
from tests.support.fault_engine import FaultEngine, fault_engine


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture
def engine(fe: FaultEngine) -> FaultEngine:
    fe.script.clear()
    fe.calls.clear()
    fe.aborted.clear()
    return fe


async def test_retries_503_before_output_then_succeeds(engine: FaultEngine) -> None:
    engine.script[:] = ["503", "503", "ok"]
    backend = SGLangBackend(engine.url, retries=3)
    try:
        r = await backend.generate([1, 2, 3], {"max_new_tokens": 4}, rid="r1", routing_key="s1")
    finally:
        await backend.aclose()
    assert r.output_ids == engine.reply and r.logprobs == [-0.5] * len(engine.reply)
    assert r.weight_version == "v7" and r.finish_type == "stop"
    assert len(engine.calls) == 3 and all(c["rid"] == "r1" and c["return_logprob"] for c in engine.calls)


async def test_500_is_not_retried_and_400_is_the_callers_error(engine: FaultEngine) -> None:
    backend = SGLangBackend(engine.url, retries=3)
    try:
        engine.script[:] = ["500"]
        with pytest.raises(UpstreamError) as err:
            await backend.generate([1], {}, rid="a", routing_key="s")
        assert err.value.status == 502 and "injected 500" in err.value.message
        assert len(engine.calls) == 1
        engine.script[:] = ["400"]
        with pytest.raises(InvalidRequest, match="injected 400"):
            await backend.generate([1], {}, rid="b", routing_key="s")
    finally:
        await backend.aclose()


async def test_engine_abort_is_raised_not_returned_as_output(engine: FaultEngine) -> None:
    engine.script[:] = ["abort"]
    backend = SGLangBackend(engine.url)
    try:
        with pytest.raises(UpstreamAborted):
            await backend.generate([1], {}, rid="c", routing_key="s")
    finally:
        await backend.aclose()


async def test_dropped_stream_fails_loudly_and_aborts_the_rid(engine: FaultEngine) -> None:
    engine.script[:] = ["drop"]
    backend = SGLangBackend(engine.url)
    got: list[list[int]] = []
    try:
        with pytest.raises(UpstreamError):
            async for update in backend.stream([1], {}, rid="d", routing_key="s"):
                got.append(update.new_ids)
    finally:
        await backend.aclose()
    assert got == [engine.reply[:1]]
    assert engine.aborted == ["d"]


async def test_read_timeout_is_504_and_cancellation_aborts(engine: FaultEngine) -> None:
    engine.script[:] = ["slow"]
    backend = SGLangBackend(engine.url, request_timeout=0.5)
    try:
        with pytest.raises(UpstreamError) as err:
            await backend.generate([1], {}, rid="e", routing_key="s")
        assert err.value.status == 504
        engine.script[:] = ["slow"]
        task = asyncio.create_task(backend.generate([1], {}, rid="f", routing_key="s"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
    finally:
        await backend.aclose()
    assert "e" in engine.aborted and "f" in engine.aborted


async def test_streams_cumulative_chunks_into_new_ids(engine: FaultEngine) -> None:
    backend = SGLangBackend(engine.url)
    try:
        updates = [u async for u in backend.stream([1], {}, rid="g", routing_key="s")]
    finally:
        await backend.aclose()
    ids = [t for u in updates for t in u.new_ids]
    assert ids == engine.reply
    assert updates[-1].result is not None and updates[-1].result.output_ids == engine.reply
    assert engine.calls[-1]["stream"] is True
