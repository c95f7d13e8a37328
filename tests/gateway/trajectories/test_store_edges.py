"""The trajectory store's read side at its edges: summaries, counts, batches, every tenant at once,
the wire forms, and a long poll that runs out; on both backends (real SQLite, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories import store as store_module
from rlgw.gateway.trajectories.backends import Store, open_store, open_store_readonly
from rlgw.gateway.trajectories.store import (
    StoreError,
    decode_arrays,
    default_data_dir,
    encode_arrays,
)
from tests.support.store_backends import BACKENDS, store_location


def sample(i: int, n: int = 6) -> Sample:
    mask = np.asarray([1, 1, 0, 1, 0, 1][:n], dtype=np.uint8)
    return Sample(
        tokens=np.arange(100 * i, 100 * i + 4 + n, dtype=np.int32),
        response_length=n,
        loss_mask=mask,
        rollout_log_probs=np.where(mask == 1, -0.5, 0.0).astype(np.float32),
        reward=float(i),
        status=SampleStatus.TRUNCATED if i % 2 else SampleStatus.COMPLETED,
        rollout_id=f"r{i}",
        group_index=i,
        weight_versions=[VersionSpan("v1", 0, 2), VersionSpan("v2", 2, n)],
        metadata={"i": i},
    )


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_location(request, request.param, tmp_path / "nested")


@pytest.fixture
async def filled(location: str, tmp_path: Path):
    """Tenant a: samples 0-3 (two finishes); tenant b: sample 4; cursors 1-5 in that order."""
    store = open_store(location, tmp_path)
    await store.add_samples("a", "s0", "task", [sample(0), sample(1)])
    await store.add_samples("b", "s4", "task", [sample(4)])
    await store.add_samples("a", "s2", "task", [sample(2), sample(3)], segments=[0, 3])
    yield store
    await store.close()


async def test_summaries_bound_order_and_describe_without_arrays(filled: Store) -> None:
    rows = await filled.summaries("a")
    assert [r.cursor for r in rows] == [1, 2, 4, 5]
    first = rows[1]
    assert (first.tenant, first.session_id, first.task_id, first.segment) == ("a", "s0", "task", 1)
    assert (first.rollout_id, first.group_index, first.status, first.reward) == ("r1", 1, "truncated", 1.0)
    assert (first.response_length, first.trainable_tokens) == (6, 4)
    assert first.weight_versions == [VersionSpan("v1", 0, 2), VersionSpan("v2", 2, 6)]
    assert first.metadata == {"i": 1} and rows[3].segment == 3
    assert [r.cursor for r in filled.summaries_sync("a", after=1, before=5)] == [2, 4]
    assert [r.cursor for r in filled.summaries_sync("a", limit=2, newest_first=True)] == [5, 4]
    assert [r.cursor for r in filled.summaries_sync(None)] == [1, 2, 3, 4, 5]
    assert [r.cursor for r in filled.summaries_sync(None, before=3, newest_first=True)] == [2, 1]


async def test_counts_lists_and_batches_per_tenant_or_for_all(filled: Store) -> None:
    assert filled.count_sync("a") == 4 and filled.count_sync("a", after=2) == 2
    assert filled.count_sync(None) == 5 and filled.count_sync(None, after=4) == 1
    assert filled.count_sync("nobody") == 0
    assert [s.cursor for s in filled.list_sync(None, after=1, limit=3)] == [2, 3, 4]
    assert [s.tenant for s in filled.list_sync(None)] == ["a", "a", "b", "a", "a"]
    assert [s.cursor for s in filled.iter_sync("a", batch=1)] == [1, 2, 4, 5]
    assert [s.cursor for s in filled.iter_sync(None, after=3, batch=2)] == [4, 5]
    got = filled.get_sync(None, 3)
    assert got is not None and got.tenant == "b" and got.sample.reward == 4.0
    assert filled.get_sync("a", 3) is None and filled.get_sync(None, 99) is None
    assert (await filled.get("b", 3)) is not None


async def test_an_empty_finish_writes_nothing(filled: Store) -> None:
    assert await filled.add_samples("a", "s9", "task", []) == []
    assert filled.count_sync(None) == 5


async def test_listings_default_to_100_rows(filled: Store) -> None:
    await filled.add_samples("c", "many", "task", [sample(i % 7) for i in range(101)])
    assert len(filled.summaries_sync("c")) == 100 and len(await filled.list("c")) == 100
    assert len(filled.list_sync("c")) == 100


async def test_a_read_only_store_answers_async_reads_too(
    filled: Store, location: str, tmp_path: Path
) -> None:
    ro = open_store_readonly(location, tmp_path)
    try:
        assert [s.cursor for s in await ro.list("a")] == [1, 2, 4, 5]
        assert [r.cursor for r in await ro.summaries("b")] == [3]
        with pytest.raises(StoreError, match="read-only"):
            await ro.add_samples("a", "s", "task", [sample(1)])
    finally:
        await ro.close()


async def test_a_long_poll_with_nothing_new_returns_at_its_timeout(
    filled: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the in-process commit event may wake a waiter here, not the cross-process re-read.
    monkeypatch.setattr(store_module, "CROSS_PROCESS_POLL_S", 60.0)
    for tenant, after in (("a", 5), ("nobody", 0)):
        t0 = time.monotonic()
        await filled.wait(tenant, after=after, timeout=0.3)
        assert 0.25 <= time.monotonic() - t0 < 5
    t0 = time.monotonic()
    await filled.wait("a", after=4, timeout=30)  # cursor 5 is newer: at once
    assert time.monotonic() - t0 < 5
    waiter = asyncio.create_task(filled.wait("b", after=3, timeout=30))
    await asyncio.sleep(0.05)
    await filled.add_samples("a", "s5", "task", [sample(5)])  # another tenant's commit
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await filled.add_samples("b", "s6", "task", [sample(6)])
    await asyncio.wait_for(waiter, 5)


async def test_wire_forms(filled: Store) -> None:
    stored = filled.get_sync("a", 2)
    assert stored is not None
    line = stored.to_json()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = orjson.loads(line)
    assert "tenant" not in doc and doc["cursor"] == 2 and doc["tokens"] == sample(1).tokens.tolist()
    assert doc["rollout_log_probs"] == [-0.5, -0.5, 0.0, -0.5, 0.0, -0.5]
    tagged = orjson.loads(stored.to_json(with_tenant=True))
    assert next(iter(tagged)) == "tenant" and tagged["tenant"] == "a" and tagged["segment"] == 1
    assert isinstance(stored.to_dict(numpy=True)["tokens"], np.ndarray)
    assert isinstance(stored.to_dict()["tokens"], list)


def test_array_blobs_with_trailing_bytes_are_refused() -> None:
    blob = encode_arrays(sample(1))
    raw = zstandard.ZstdDecompressor().decompress(blob) + b"\x00\x00"
    with pytest.raises(StoreError, match="2 trailing bytes"):
        decode_arrays(zstandard.ZstdCompressor().compress(raw))


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RLGW_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "rlgw"
