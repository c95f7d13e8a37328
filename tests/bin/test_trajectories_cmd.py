"""`rlgw trajectories list|show|export` as real subprocesses on a store the test fills."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.sample_factory import assert_same_sample, make_sample


def rlgw(*args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("RLGW_DATA_DIR", None)
    extra = ["--data-dir", str(data_dir)] if data_dir is not None else []
    return subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "trajectories", *args, *extra],
        capture_output=True,
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], list[Sample]]:
    """A store with alice's two sessions (one with teacher fields) and bob's one, left open for writing."""
    import asyncio

    data = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    samples = [
        make_sample(rng, response=80),
        make_sample(rng, response=30, teacher_k=3, reward=None),
        make_sample(rng, response=50, reward=0.25, metadata={"termination_reason": "max_turns"}),
    ]

    async def fill() -> list[int]:
        store = TrajectoryStore.open(data)
        cursors = await store.add_samples("alice", "sess-1", "task-1", samples[:2])
        cursors += await store.add_samples("bob", "sess-2", "task-2", samples[2:])
        await store.close()
        return cursors

    return data, asyncio.run(fill()), samples


def test_list_prints_a_table_per_tenant(filled) -> None:
    data, cursors, samples = filled
    out = rlgw("list", data_dir=data)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.decode().splitlines()]
    assert rows[0] == [
        "cursor",
        "session",
        "task",
        "segment",
        "status",
        "reward",
        "response_length",
        "trainable",
    ]
    trainable = str(int(samples[1].loss_mask.sum()))
    assert rows[2] == [str(cursors[1]), "sess-1", "task-1", "1", "completed", "-", "30", trainable]
    assert [r[0] for r in rows[1:]] == [str(c) for c in cursors]

    only_bob = rlgw("list", "--tenant", "bob", data_dir=data)
    assert [line.split()[0] for line in only_bob.stdout.decode().splitlines()[1:]] == [str(cursors[2])]
    after = rlgw("list", "--after", str(cursors[0]), "--limit", "1", data_dir=data)
    assert [line.split()[0] for line in after.stdout.decode().splitlines()[1:]] == [str(cursors[1])]


def test_show_prints_one_sample_as_json(filled) -> None:
    data, cursors, samples = filled
    out = rlgw("show", str(cursors[1]), data_dir=data)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    assert (doc["tenant"], doc["cursor"], doc["session_id"]) == ("alice", cursors[1], "sess-1")
    for key in ("tenant", "cursor", "session_id", "task_id", "segment", "created_at"):
        doc.pop(key)
    assert_same_sample(Sample.from_dict(doc), samples[1])

    hidden = rlgw("show", str(cursors[2]), "--tenant", "alice", data_dir=data)
    assert hidden.returncode == 1 and b"no sample with cursor" in hidden.stderr


def test_export_jsonl_round_trips(filled, tmp_path: Path) -> None:
    data, cursors, samples = filled
    out_file = tmp_path / "all.jsonl"
    out = rlgw("export", "--format", "jsonl", "--out", str(out_file), data_dir=data)
    assert out.returncode == 0, out.stderr
    assert b"exported 3 samples" in out.stderr
    docs = [orjson.loads(line) for line in out_file.read_bytes().splitlines()]
    assert [d["cursor"] for d in docs] == cursors
    for doc, want in zip(docs, samples, strict=True):
        assert_same_sample(Sample.from_dict(doc), want)
    assert not list(tmp_path.glob(".*partial"))

    tail = rlgw("export", "--format", "jsonl", "--out", "-", "--after", str(cursors[1]), data_dir=data)
    assert [orjson.loads(line)["cursor"] for line in tail.stdout.splitlines()] == cursors[2:]


def test_export_parquet_has_slime_columns(filled, tmp_path: Path) -> None:
    data, cursors, samples = filled
    out_file = tmp_path / "alice.parquet"
    out = rlgw("export", "--format", "parquet", "--out", str(out_file), "--tenant", "alice", data_dir=data)
    assert out.returncode == 0, out.stderr
    table = pq.read_table(out_file)
    for name in ("tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "status"):
        assert name in table.column_names
    rows = table.to_pylist()
    assert [r["cursor"] for r in rows] == cursors[:2]
    for row, want in zip(rows, samples[:2], strict=True):
        row["metadata"] = orjson.loads(row["metadata"])
        got = Sample.from_dict(row)
        assert_same_sample(got, want)
    assert table.schema.field("tokens").type.value_type == pa.int32()  # ids stay int32, not int64
    assert rows[0]["teacher_topk_indices"] is None
    assert np.asarray(rows[1]["teacher_topk_indices"]).shape == (30, 3)
    np.testing.assert_array_equal(rows[1]["teacher_topk_logprobs"], samples[1].teacher_topk_logprobs)

    # A batch where no sample has teacher fields still writes (all-null list columns).
    bob_file = tmp_path / "bob.parquet"
    out = rlgw("export", "--format", "parquet", "--out", str(bob_file), "--tenant", "bob", data_dir=data)
    assert out.returncode == 0, out.stderr
    bob = pq.read_table(bob_file).to_pylist()
    assert [r["cursor"] for r in bob] == cursors[2:] and bob[0]["teacher_log_probs"] is None
    assert bob[0]["reward"] == 0.25 and orjson.loads(bob[0]["metadata"]) == samples[2].metadata


def test_missing_store_and_help(tmp_path: Path) -> None:
    out = rlgw("list", data_dir=tmp_path / "nowhere")
    assert out.returncode == 2 and b"no trajectory store" in out.stderr
    help_out = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "trajectories", "--help"], capture_output=True, timeout=60
    )
    assert help_out.returncode == 0 and b"rlgw trajectories export --format parquet" in help_out.stdout


def test_list_and_export_read_a_postgresql_store(pg_url: str, tmp_path: Path) -> None:
    import asyncio

    from rlgw.gateway.trajectories.pg_store import PgTrajectoryStore

    rng = np.random.default_rng(1)
    samples = [make_sample(rng, response=20), make_sample(rng, response=10, teacher_k=2)]

    async def fill() -> list[int]:
        store = PgTrajectoryStore.open(pg_url)
        cursors = await store.add_samples("alice", "sess-1", "task-1", samples)
        await store.close()
        return cursors

    cursors = asyncio.run(fill())
    listed = rlgw("list", "--store", pg_url, data_dir=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.decode().splitlines()[1:]] == [str(c) for c in cursors]
    out = rlgw("export", "--format", "jsonl", "--store", pg_url, data_dir=tmp_path)
    docs = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [d["cursor"] for d in docs] == cursors
    for doc, want in zip(docs, samples, strict=True):
        assert_same_sample(Sample.from_dict(doc), want)
    empty = rlgw("list", "--store", pg_url.rsplit("/", 1)[0] + "/postgres", data_dir=tmp_path)
    assert empty.returncode == 2 and b"holds no trajectory store" in empty.stderr
