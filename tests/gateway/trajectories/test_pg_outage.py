"""PostgreSQL restarted under the store and the journal: while it is down their calls fail with
`StoreUnavailable` (the gateway's 503), nothing committed is lost, and once it is back the same
objects reconnect on their next call, and the store's long poll is woken by commits again."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rlgw.gateway.errors import StoreUnavailable
from rlgw.gateway.sessions.pg_journal import WRITERS, PgSessionJournal
from rlgw.gateway.trajectories.pg_store import PgTrajectoryStore
from tests.support.postgres import Cluster
from tests.support.sample_factory import make_sample


async def test_a_restarted_database_fails_calls_clearly_then_serves_again(pg_cluster: Cluster) -> None:
    url = pg_cluster.fresh_url()
    rng = np.random.default_rng(0)
    # `full`: a turn is flushed before it returns, so the server's crash below cannot take it back
    # (`normal` commits asynchronously: a crash of the server itself may lose its last turns).
    store, journal = PgTrajectoryStore.open(url), PgSessionJournal.open(url, sync="full")
    try:
        before = await store.add_samples("t", "s-1", "task", [make_sample(rng)])
        await journal.opened("s-2", {"id": "s-2"}, b"\1" * 32)
        await journal.turn("s-2", {"n": 1})
        # Every writer thread holds a connection the restart will end (the executor starts a thread
        # per call submitted while none is idle): each must notice before its next turn's insert,
        # which is not repeated once sent.
        writers = [f"w-{i}" for i in range(WRITERS)]
        await asyncio.gather(*(journal.opened(w, {"id": w}, b"\2" * 32) for w in writers))
        await asyncio.gather(*(journal.turn(w, {"n": 1}) for w in writers))
        await store.wait("t", after=0, timeout=5)  # the listener runs
        pg_cluster.stop("immediate")  # a crash: no shutdown checkpoint
        try:
            with pytest.raises(StoreUnavailable):
                await store.add_samples("t", "s-3", "task", [make_sample(rng)])
            with pytest.raises(StoreUnavailable):
                await journal.turn("s-2", {"n": 2})
            with pytest.raises(StoreUnavailable):
                await store.list("t")
        finally:
            pg_cluster.start()
        assert [s.cursor for s in await store.list("t")] == before  # committed, kept; the failed one absent
        assert [t["n"] for t in journal.load("s-2").turns] == [1]
        waiter = asyncio.create_task(store.wait("t", after=before[-1], timeout=60))
        await asyncio.sleep(0.1)
        after = await store.add_samples("t", "s-3", "task", [make_sample(rng)])
        await asyncio.wait_for(waiter, 30)  # woken (the listener listens again), not timed out
        assert after[0] > before[-1]
        await journal.turn("s-2", {"n": 2})
        assert [t["n"] for t in journal.load("s-2").turns] == [1, 2]
        await asyncio.gather(*(journal.turn(w, {"n": 2}) for w in writers))
        assert all([t["n"] for t in journal.load(w).turns] == [1, 2] for w in writers)
    finally:
        await store.close()
        journal.close()
