"""Store gaps the mutation bench found (`bench/mutation.py`), on both backends: which sessions
already have their samples stored (what start-up asks of the journal's open sessions), across more
ids than SQLite binds in one query."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgw.gateway.trajectories.backends import open_store
from tests.gateway.trajectories.test_store_edges import sample
from tests.support.store_backends import BACKENDS, store_location


@pytest.mark.parametrize("kind", BACKENDS)
async def test_stored_sessions_finds_exactly_the_stored_ones_across_query_chunks(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> None:
    store = open_store(store_location(request, kind, tmp_path), tmp_path)
    try:
        ids = [f"s{i}" for i in range(1001)]  # SQLite: five chunks of at most 250 ids
        stored = {"s0", "s499", "s500", "s1000"}  # each chunk's first or last id
        for sid in sorted(stored):
            await store.add_samples("a", sid, "task", [sample(1)])
        assert await store.stored_sessions(ids) == stored
        assert store.stored_sessions_sync(["s1", "s0", "missing"]) == {"s0"}
        assert store.stored_sessions_sync([]) == set()
    finally:
        await store.close()
