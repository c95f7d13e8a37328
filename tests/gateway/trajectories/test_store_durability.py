"""The store across crashes: a writer process SIGKILLed during a commit never leaves half a finish.

A real child process writes finishes (three segments each) through `TrajectoryStore.add_samples`
and prints an ack once each call returns, as `finish` answers the trainer. It is killed with
SIGKILL, either at a chosen SQL statement of a commit (between two INSERTs, or as COMMIT starts,
via a trace callback on the connections it opens) or at a random moment of a busy write loop.
Reopening the file must show every acked finish, and every finish it shows must be whole and
token-exact. The durability that survives power loss, not just a killed process, is the fsync
of each commit (`synchronous=FULL`): asserted on the store's connection, and, where `strace`
exists, seen as an fdatasync of the WAL between a commit and its ack.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.store import DB_NAME, TrajectoryStore
from tests.support.procs import REPO

SEGMENTS = 3


def segment_sample(finish: int, segment: int, tokens: int = 2048) -> Sample:
    """The deterministic sample of segment `segment` of finish `finish` (rollout id names both)."""
    rng = np.random.default_rng(1000 * finish + segment)
    n = tokens // 2
    mask = (rng.random(n) < 0.7).astype(np.uint8)
    mask[0] = 1
    return Sample(
        tokens=rng.integers(0, 150_000, tokens, dtype=np.int32),
        response_length=n,
        loss_mask=mask,
        rollout_log_probs=np.where(mask == 1, -rng.random(n), 0.0).astype(np.float32),
        reward=float(finish),
        status=SampleStatus.COMPLETED,
        rollout_id=f"f{finish}",
        group_index=segment,
        weight_versions=[VersionSpan("v1", 0, n)],
        metadata={"finish": finish, "segment": segment},
    )


def writer(data_dir: str, first: int, count: int, kill_at: str) -> None:
    """Child process: write finishes `first`.. and ack each; SIGKILL self at `kill_at` ("insert:K"
    = as the K-th INSERT starts, "commit:K" = as the K-th COMMIT starts, "" = never)."""
    import sqlite3

    what, _, nth = kill_at.partition(":")
    seen = {"insert": 0, "commit": 0}
    armed = False  # statements of opening the store are not counted

    def trace(statement: str) -> None:
        verb = statement.split(None, 1)[0].lower()
        if armed and verb in seen:
            seen[verb] += 1
            if verb == what and seen[verb] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    connect = sqlite3.connect

    def traced(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = traced

    async def run() -> None:
        nonlocal armed
        store = TrajectoryStore.open(Path(data_dir))
        armed = True
        for f in range(first, first + count):
            samples = [segment_sample(f, s) for s in range(SEGMENTS)]
            cursors = await store.add_samples("t", f"s{f}", "task", samples)
            print(f"ack {f} {' '.join(map(str, cursors))}", flush=True)
        await store.close()

    asyncio.run(run())


def start_writer(data_dir: Path, first: int, count: int, kill_at: str = "", prefix: tuple = ()):
    code = f"from {__name__} import writer; writer({str(data_dir)!r}, {first}, {count}, {kill_at!r})"
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def acks(lines: list[str]) -> dict[int, list[int]]:
    out = {}
    for line in lines:
        if line.startswith("ack "):
            f, *cursors = map(int, line.split()[1:])
            out[f] = cursors
    return out


def check_store(data_dir: Path, acked: dict[int, list[int]]) -> dict[int, list[int]]:
    """Reopen after a crash: acked finishes are there, and every finish there is whole and exact."""
    store = TrajectoryStore.open(data_dir)
    try:
        rows = store.list_sync(None, limit=10_000)
    finally:
        store.close_sync()
    found: dict[int, list[int]] = {}
    for row in rows:
        f, segment = row.sample.metadata["finish"], row.segment
        want = segment_sample(f, segment)
        np.testing.assert_array_equal(row.sample.tokens, want.tokens)
        np.testing.assert_array_equal(row.sample.loss_mask, want.loss_mask)
        np.testing.assert_array_equal(row.sample.rollout_log_probs, want.rollout_log_probs)
        assert row.session_id == f"s{f}" and row.sample.reward == float(f)
        found.setdefault(f, []).append(row.cursor)
    for f, cursors in found.items():
        assert len(cursors) == SEGMENTS, f"finish {f} is half written: segments at cursors {cursors}"
    for f, cursors in acked.items():
        assert found.get(f) == cursors, f"acked finish {f} (cursors {cursors}) is not in the store"
    return found


@pytest.mark.parametrize(
    "kill_at",
    ["insert:2", "insert:6", "commit:1", "commit:3"],
    ids=["between-inserts-of-the-first", "last-insert-of-the-second", "first-commit", "third-commit"],
)
def test_a_writer_killed_inside_a_commit_leaves_whole_finishes(tmp_path: Path, kill_at: str) -> None:
    data = tmp_path / "data"
    proc = start_writer(data, 0, 5, kill_at)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    acked = acks(out.splitlines())
    found = check_store(data, acked)
    # The killed finish left nothing; those acked before it are all there.
    assert sorted(found) == sorted(acked)
    n_commits = int(kill_at.split(":")[1]) - 1 if kill_at.startswith("commit") else None
    if n_commits is not None:
        assert len(acked) == n_commits


def test_random_kills_during_a_write_loop_never_lose_an_ack_or_tear_a_finish(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = np.random.default_rng(7)
    acked: dict[int, list[int]] = {}
    first = 0
    for _ in range(4):
        proc = start_writer(data, first, 1000)
        assert proc.stdout is not None
        lines: list[str] = []
        wanted = int(rng.integers(1, 6))
        while len(lines) < wanted:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(line)
        proc.send_signal(signal.SIGKILL)  # while it is already writing the next finish
        rest, _ = proc.communicate(timeout=60)
        acked.update(acks(lines + rest.splitlines()))
        found = check_store(data, acked)
        first = max(found) + 1
    # Cursors never go back after a crash: AUTOINCREMENT survives recovery.
    all_cursors = [c for f in sorted(found) for c in found[f]]
    assert all_cursors == sorted(all_cursors) and len(set(all_cursors)) == len(all_cursors)


async def test_the_store_commits_with_synchronous_full_in_wal_mode(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    try:
        # synchronous is per connection: read it on the writer's own (an internal name).
        assert store._writer.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        await store.close()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_each_ack_follows_an_fdatasync_of_the_wal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    TrajectoryStore.open(data).close_sync()
    log = tmp_path / "strace.log"
    prefix = ("strace", "-f", "-y", "-qq", "-o", str(log), "-e", "trace=fsync,fdatasync,write")
    proc = start_writer(data, 0, 4, prefix=prefix)
    out, err = proc.communicate(timeout=180)
    if proc.returncode != 0 and "ptrace" in err:
        pytest.skip(f"strace cannot trace here: {err.strip()[:200]}")
    assert proc.returncode == 0, err
    assert len(acks(out.splitlines())) == 4
    # Between two acks (writes of "ack ..." to stdout) there must be a sync of the WAL file.
    synced = False
    acks_seen = 0
    for line in log.read_text().splitlines():
        if re.search(r"f(data)?sync\(\d+<[^>]*" + re.escape(DB_NAME) + r"-wal>\)", line):
            synced = True
        elif re.search(r'write\(1<[^>]*>, "ack ', line):
            assert synced, f"ack {acks_seen} was printed before its commit reached the disk"
            synced = False
            acks_seen += 1
    assert acks_seen == 4
