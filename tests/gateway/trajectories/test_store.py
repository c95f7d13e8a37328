"""The trajectory store on both backends (a real SQLite file, a real PostgreSQL database): round trips,
atomic finishes, tenants, long-poll wakeups; then SQLite's file handling."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rlgw.gateway.sample import SampleStatus
from rlgw.gateway.trajectories.backends import Store, open_store, open_store_readonly
from rlgw.gateway.trajectories.store import (
    DB_NAME,
    RolloutTaken,
    StoreError,
    TrajectoryStore,
    decode_arrays,
    default_data_dir,
    encode_arrays,
)
from tests.support.sample_factory import assert_same_sample, make_sample
from tests.support.store_backends import BACKENDS, integrity_errors, store_location


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_location(request, request.param, tmp_path)


@pytest.fixture
async def store(location: str, tmp_path: Path):
    s = open_store(location, tmp_path)
    yield s
    await s.close()


async def test_round_trip_is_token_exact_with_teacher_fields(store: Store) -> None:
    rng = np.random.default_rng(0)
    plain = make_sample(rng, prompt=30, response=200)
    teacher = make_sample(
        rng, prompt=10, response=50, teacher_k=4, reward=None, metadata={"a": {"b": [1, 2]}}
    )
    teacher.status = SampleStatus.TRUNCATED
    cursors = await store.add_samples("t1", "sess-1", "task-9", [plain, teacher])
    assert cursors[1] == cursors[0] + 1

    got = await store.list("t1")
    assert [g.cursor for g in got] == cursors
    assert [(g.session_id, g.task_id, g.segment, g.tenant) for g in got] == [
        ("sess-1", "task-9", 0, "t1"),
        ("sess-1", "task-9", 1, "t1"),
    ]
    assert_same_sample(got[0].sample, plain)
    assert_same_sample(got[1].sample, teacher)
    assert got[1].sample.teacher_topk_indices.shape == (50, 4)
    # Trainers may normalise in place: decoded arrays must be writable.
    got[0].sample.rollout_log_probs *= 2

    # A finish whose segment 1 was rejected stores segments 0 and 2 under their ledger indices.
    later = await store.add_samples("t1", "sess-2", "task-9", [plain, plain], segments=[0, 2])
    assert [g.segment for g in await store.list("t1", after=cursors[-1])] == [0, 2]
    assert later[0] > cursors[1]
    with pytest.raises(ValueError, match="segment indices"):
        await store.add_samples("t1", "sess-3", "task-9", [plain], segments=[0, 1])

    one = await store.get("t1", cursors[1])
    assert one is not None
    assert_same_sample(one.sample, teacher)
    wire = one.to_dict()
    assert wire["cursor"] == cursors[1] and "tenant" not in wire
    assert wire["status"] == "truncated" and wire["reward"] is None
    assert wire["teacher_topk_indices"][0] == teacher.teacher_topk_indices[0].tolist()


async def test_list_pages_by_cursor_and_tenants_are_isolated(store: Store) -> None:
    rng = np.random.default_rng(1)
    a = [make_sample(rng) for _ in range(5)]
    b = [make_sample(rng) for _ in range(2)]
    ca = await store.add_samples("alice", "s-a", "task", a[:3])
    cb = await store.add_samples("bob", "s-b", "task", b)
    ca += await store.add_samples("alice", "s-a2", "task", a[3:])

    first = await store.list("alice", limit=2)
    rest = await store.list("alice", after=first[-1].cursor, limit=100)
    assert [s.cursor for s in first + rest] == ca
    assert [s.cursor for s in await store.list("bob")] == cb
    assert await store.list("carol") == []
    # Another tenant's cursor looks exactly like a missing one.
    assert await store.get("alice", cb[0]) is None
    assert await store.get("bob", cb[0]) is not None
    assert await store.get("bob", 10_000) is None


async def test_finish_is_all_or_nothing(store: Store) -> None:
    rng = np.random.default_rng(2)
    good = make_sample(rng)
    broken = make_sample(rng)
    broken.rollout_id = None  # violates NOT NULL on the second INSERT, after the first succeeded
    with pytest.raises(integrity_errors()):
        await store.add_samples("t", "s", "task", [good, broken])
    assert await store.list("t") == []
    # The writer connection is left usable (no transaction stuck open).
    cursors = await store.add_samples("t", "s", "task", [good])
    assert [s.cursor for s in await store.list("t")] == cursors


async def test_concurrent_finishes_commit_together_but_fail_alone(store: Store) -> None:
    rng = np.random.default_rng(7)
    broken = make_sample(rng)
    broken.rollout_id = None
    finishes = [[make_sample(rng), make_sample(rng)] for _ in range(6)]
    finishes.insert(3, [make_sample(rng), broken])
    results = await asyncio.gather(
        *(store.add_samples("t", f"s{i}", "task", f) for i, f in enumerate(finishes)), return_exceptions=True
    )
    assert isinstance(results[3], integrity_errors())
    stored = await store.list("t")
    assert sorted({s.session_id for s in stored}) == sorted(f"s{i}" for i in range(7) if i != 3)
    for i, cursors in enumerate(results):
        if i != 3:
            got = [s for s in stored if s.session_id == f"s{i}"]
            assert [s.cursor for s in got] == cursors and [s.segment for s in got] == [0, 1]
            assert_same_sample(got[1].sample, finishes[i][1])


async def test_reopen_keeps_samples_and_cursors_keep_growing(location: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    sample = make_sample(rng)
    s1 = open_store(location, tmp_path)
    first = await s1.add_samples("t", "s", "task", [sample, sample])
    await s1.close()

    ro = open_store_readonly(location, tmp_path)  # after a clean close: no -wal/-shm left
    assert [s.cursor for s in ro.list_sync(None)] == first
    ro.close_sync()

    s2 = open_store(location, tmp_path)
    second = await s2.add_samples("t", "s2", "task", [sample])
    assert second[0] > first[-1]
    # A read-only reader sees a live writer's committed rows (WAL).
    ro = open_store_readonly(location, tmp_path)
    assert ro.count_sync("t") == 3
    assert [s.cursor for s in ro.iter_sync("t", after=first[0], batch=1)] == [first[1], second[0]]
    with pytest.raises(StoreError):
        await ro.add_samples("t", "s", "task", [sample])
    ro.close_sync()
    await s2.close()
    if not location.startswith("postgresql://"):
        assert sqlite3.connect(Path(location) / DB_NAME).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_wait_wakes_on_commit_for_that_tenant_only(store: Store) -> None:
    rng = np.random.default_rng(4)
    waiter = asyncio.create_task(store.wait("t1", after=0, timeout=30))
    other = asyncio.create_task(store.wait("t2", after=0, timeout=0.5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.add_samples("t1", "s", "task", [make_sample(rng)])
    await asyncio.wait_for(waiter, 5)  # woken by the commit, long before its 30 s
    await other
    assert await store.list("t2") == []
    # Already satisfied: returns at once.
    await asyncio.wait_for(store.wait("t1", after=0, timeout=30), 5)


async def test_wait_sees_another_processes_commit(location: str, tmp_path: Path) -> None:
    reader = open_store(location, tmp_path)
    writer = open_store(location, tmp_path)  # separate connections and events: like another process
    try:
        waiter = asyncio.create_task(reader.wait("t", after=0, timeout=30))
        await asyncio.sleep(0.05)
        await writer.add_samples("t", "s", "task", [make_sample(np.random.default_rng(5))])
        await asyncio.wait_for(waiter, 5)
    finally:
        await reader.close()
        await writer.close()


async def test_an_outcome_commits_with_its_samples_once_per_session_and_per_tenant(store: Store) -> None:
    rng = np.random.default_rng(8)
    cursors = await store.add_samples(
        "t", "s-1", "task", [make_sample(rng)], outcome=lambda cs: {"samples": [{"cursor": c} for c in cs]}
    )
    assert await store.outcome("t", "s-1") == {"samples": [{"cursor": cursors[0]}]}
    assert await store.outcome("other", "s-1") is None  # another tenant's session looks absent
    assert await store.outcome("t", "s-2") is None
    # An outcome without samples (eval mode, everything rejected, a delete) is stored too.
    assert await store.add_samples("t", "s-2", "task", [], outcome=lambda _: {"deleted": True}) == []
    assert await store.outcome("t", "s-2") == {"deleted": True}
    assert await store.stored_sessions(["s-1", "s-2", "s-3"]) == {"s-1", "s-2"}
    # A second outcome for the session fails, and its samples with it (a finish stores once).
    with pytest.raises(integrity_errors()):
        await store.add_samples("t", "s-1", "task", [make_sample(rng)], outcome=lambda _: {})
    assert len(await store.list("t")) == 1


async def test_a_finished_rollout_is_found_by_its_id_per_tenant(store: Store) -> None:
    rng = np.random.default_rng(9)
    cursors = await store.add_samples(
        "t", "s-1", "task", [make_sample(rng)], outcome=lambda cs: {"cursors": cs}, rollout_id="r-1"
    )
    await store.add_samples("t", "s-2", "task", [], outcome=lambda _: {"eval": True}, rollout_id="r-2")
    await store.add_samples(
        "t", "s-3", "task", [], outcome=lambda _: {"deleted": True}
    )  # a delete: no rollout
    assert await store.finished_rollout("t", "r-1") == {"cursors": cursors}
    assert await store.finished_rollout("t", "r-2") == {"eval": True}  # no samples, still finished
    assert await store.finished_rollout("other", "r-1") is None
    assert await store.finished_rollout("t", "r-3") is None


async def test_a_rollout_is_stored_once_when_two_attempts_finish(store: Store) -> None:
    """Two live attempts of one rollout: the first finish stores it; the second stores nothing and
    is told what the first stored, while other finishes in the same group commit go through."""
    rng = np.random.default_rng(10)
    first = await store.add_samples(
        "t", "s-1", "task", [make_sample(rng)], outcome=lambda cs: {"session_id": "s-1", "cursors": cs},
        rollout_id="r-1",
    )  # fmt: skip
    second = store.add_samples(
        "t", "s-2", "task", [make_sample(rng), make_sample(rng)], outcome=lambda _: {"session_id": "s-2"},
        rollout_id="r-1",
    )  # fmt: skip
    other = store.add_samples("t", "s-3", "task", [make_sample(rng)], outcome=lambda _: {}, rollout_id="r-2")
    results = await asyncio.gather(second, other, return_exceptions=True)
    assert isinstance(results[0], RolloutTaken)
    assert results[0].rollout_id == "r-1" and results[0].summary == {"session_id": "s-1", "cursors": first}
    assert len(results[1]) == 1  # committed beside the refused one
    assert [g.session_id for g in await store.list("t")] == ["s-1", "s-3"]
    assert await store.outcome("t", "s-2") is None  # the refused attempt left nothing
    # another tenant's rollout of the same id is its own
    assert len(await store.add_samples("u", "s-4", "task", [], outcome=lambda _: {}, rollout_id="r-1")) == 0


def test_a_store_from_before_rollout_ids_gains_the_column(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "CREATE TABLE outcomes (session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc BLOB NOT NULL);"
        """INSERT INTO outcomes VALUES ('s-old', 't', '{"old": true}');"""
    )
    db.close()
    store = TrajectoryStore.open(tmp_path)
    try:
        assert store.outcome_sync("t", "s-old") == {"old": True}
        assert store.finished_rollout_sync("t", "r-old") is None
    finally:
        store.close_sync()


def test_refuses_foreign_or_future_files(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no trajectory store"):
        TrajectoryStore.open_readonly(tmp_path)
    (tmp_path / DB_NAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a trajectory store"):
        TrajectoryStore.open_readonly(tmp_path)
    with pytest.raises(StoreError, match="not a trajectory store"):
        TrajectoryStore.open(tmp_path)

    other = tmp_path / "future"
    TrajectoryStore.open(other).close_sync()
    with sqlite3.connect(other / DB_NAME) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99"):
        TrajectoryStore.open(other)


def test_array_blob_is_compact_and_exact() -> None:
    sample = make_sample(np.random.default_rng(6), prompt=2000, response=6000)
    blob = encode_arrays(sample)
    raw = sample.tokens.nbytes + sample.loss_mask.nbytes + sample.rollout_log_probs.nbytes
    assert len(blob) < raw
    arrays = decode_arrays(blob)
    assert set(arrays) == {"tokens", "loss_mask", "rollout_log_probs"}
    assert arrays["tokens"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(arrays["tokens"], sample.tokens)


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("RLGW_DATA_DIR", str(tmp_path / "x"))
    assert default_data_dir() == tmp_path / "x"
    monkeypatch.delenv("RLGW_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / ".local" / "share" / "rlgw"
