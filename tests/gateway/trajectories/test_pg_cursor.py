"""The PostgreSQL store's cursor never skips a row, with writers on separate connections (separate
gateways) committing out of order; a plain BIGSERIAL cursor, kept here only to show the failure,
does skip one.

A reader that follows a stream remembers the last cursor it saw and asks for "after it". With a
sequence, a writer can take id 1, hold its transaction open, and commit after another writer's
id 2 was read: the reader never asks for anything below 2 again, and row 1 is lost to it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from rlgw.gateway.trajectories.pg_store import PG_SCHEMA, PgTrajectoryStore, insert_finishes
from rlgw.gateway.trajectories.store import row_values
from tests.support.sample_factory import make_sample

PATH = f"-c search_path={PG_SCHEMA}"  # the store's tables, unqualified, as its own connections see them
_NAIVE = "CREATE TABLE naive (id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL)"
_NAIVE_READ = "SELECT id FROM naive WHERE id > %s ORDER BY id"
_OURS_READ = "SELECT cursor FROM samples WHERE cursor > %s ORDER BY cursor"
Writer = Callable[[psycopg.Connection, int, str], list[int]]


def _tiny(rng: np.random.Generator) -> Any:
    return make_sample(rng, prompt=4, response=4)


def _rows(n: int, tag: str) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(len(tag))
    return [
        row_values("t", f"s-{tag}", "task", i, 0.0, make_sample(rng, prompt=4, response=4)) for i in range(n)
    ]


def _ours(conn: psycopg.Connection, n: int, tag: str) -> list[int]:
    (cursors,) = insert_finishes(conn, [(_rows(n, tag), None)])
    return cursors


def _naive(conn: psycopg.Connection, n: int, tag: str) -> list[int]:
    return [
        conn.execute("INSERT INTO naive (tenant) VALUES ('t') RETURNING id").fetchone()[0] for _ in range(n)
    ]


def _wait_until_blocked(watcher: psycopg.Connection, pid: int) -> None:
    """Until backend `pid` waits on a lock (what the server says, not a sleep)."""
    while True:
        row = watcher.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)


def test_a_writer_holding_a_smaller_cursor_open_is_not_skipped(pg_url: str) -> None:
    """Writer A takes the smaller cursor and holds its transaction open; writer B commits; the
    reader reads, then A commits, and the reader reads after the last cursor it saw."""
    store = PgTrajectoryStore.open(pg_url)
    a, b, watcher = (psycopg.connect(pg_url, options=PATH) for _ in range(3))
    watcher.autocommit = True
    watcher.execute(_NAIVE)
    try:
        # The naive cursor: B's id 2 is read before A's id 1 commits; id 1 is never read.
        (naive_a,) = _naive(a, 1, "a")
        (naive_b,) = _naive(b, 1, "b")
        b.commit()
        first = [r[0] for r in watcher.execute(_NAIVE_READ, (0,))]
        a.commit()
        later = [
            r[0] for r in watcher.execute("SELECT id FROM naive WHERE id > %s ORDER BY id", (first[-1],))
        ]
        assert naive_a < naive_b and first == [naive_b] and later == []  # row naive_a skipped

        # The store's cursor: B cannot take a cursor until A commits, so it cannot be seen first.
        (ours_a,) = _ours(a, 1, "a")
        b_done: list[int] = []
        b_pid = b.info.backend_pid
        writer_b = threading.Thread(target=lambda: (b_done.extend(_ours(b, 1, "b")), b.commit()))
        writer_b.start()
        _wait_until_blocked(watcher, b_pid)
        assert store.list_sync(None, after=0) == []  # nothing visible, nothing to skip
        a.commit()
        writer_b.join()
        seen = [s.cursor for s in store.list_sync(None, after=0)]
        assert seen == [ours_a, b_done[0]] and ours_a < b_done[0]
    finally:
        for c in (a, b, watcher):
            c.close()
        store.close_sync()


def _follow(
    url: str,
    write: Callable[[psycopg.Connection, int, str], list[int]],
    read: Callable[[Any, int], list[int]],
) -> dict[str, int]:
    """Writers on their own connections commit finishes while holding each transaction open a random
    while; a reader follows by its last cursor. Returns what it committed, saw, doubled and missed."""
    writers, finishes = 4, 25
    committed: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def writer(k: int) -> None:
        rng = random.Random(k)
        with psycopg.connect(url, options=PATH) as conn:
            for f in range(finishes):
                ids = write(conn, rng.randint(1, 3), f"{k}-{f}")
                time.sleep(rng.random() * 0.004)  # the transaction stays open after its ids are taken
                conn.commit()
                with lock:
                    committed.extend(ids)

    seen: list[int] = []

    def reader() -> None:
        with psycopg.connect(url, autocommit=True, options=PATH) as conn:
            last = 0
            while True:
                finished = done.is_set()  # read once more after the last commit
                page = read(conn, last)
                seen.extend(page)
                last = page[-1] if page else last
                if finished:
                    return

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
    follower = threading.Thread(target=reader)
    follower.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    follower.join()
    return {
        "writers": writers,
        "rows": len(committed),
        "seen": len(set(seen)),
        "duplicates": len(seen) - len(set(seen)),
        "missed": len(set(committed) - set(seen)),
    }


def test_a_follower_sees_every_row_of_concurrent_writers_exactly_once(pg_url: str) -> None:
    PgTrajectoryStore.open(pg_url).close_sync()
    with psycopg.connect(pg_url, autocommit=True, options=PATH) as conn:
        conn.execute(_NAIVE)

    def ours(conn: Any, after: int) -> list[int]:
        return [r[0] for r in conn.execute(_OURS_READ, (after,))]

    def naive(conn: Any, after: int) -> list[int]:
        return [r[0] for r in conn.execute(_NAIVE_READ, (after,))]

    figures = {"commit-ordered": _follow(pg_url, _ours, ours), "bigserial": _follow(pg_url, _naive, naive)}
    for name, f in figures.items():
        print(f"cursor {name}: {f}")  # the figures (pytest -s shows them)
    got = figures["commit-ordered"]
    # Only ours is asserted: whether the naive cursor skips here depends on timing (the test
    # above forces its skip); its figures show how often it does.
    assert got["seen"] == got["rows"] and got["duplicates"] == 0 and got["missed"] == 0
