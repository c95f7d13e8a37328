"""The session table: keys, tenants, expiry."""

from __future__ import annotations

import time

import pytest

from rlgw.gateway.errors import Conflict, NotFound
from rlgw.gateway.ledger.ledger import Policy
from rlgw.gateway.sessions.table import Mode, SessionTable


def _open(table: SessionTable, tenant: str = "a", mode: Mode = Mode.CAPTURE):
    return table.create(
        tenant=tenant,
        task_id="t",
        mode=mode,
        rollout_id=None,
        group_index=0,
        policy=Policy.SEGMENT,
        metadata={},
        sampling={},
    )


def test_keys_find_only_their_session_and_tenants_are_separate() -> None:
    table = SessionTable()
    s1, k1 = _open(table, "a")
    s2, k2 = _open(table, "b")
    assert k1 != k2 and table.by_key(k1) is s1 and table.by_key(k2) is s2
    assert table.by_key(k1 + "x") is None
    assert table.check_key(s1, k1) and not table.check_key(s1, k2)
    with pytest.raises(NotFound):
        table.get(s1.id, tenant="b")
    assert table.get(s1.id, tenant="a") is s1
    assert s1.ledger is not None and _open(table, mode=Mode.EVAL)[0].ledger is None
    s1.finished = True
    with pytest.raises(Conflict):
        table.get_open(s1.id)
    table.remove(s1.id)
    assert table.by_key(k1) is None and len(table) == 2


async def test_idle_sessions_expire_but_not_busy_ones() -> None:
    table = SessionTable()
    old, _ = _open(table)
    busy, _ = _open(table)
    fresh, _ = _open(table)
    old.last_active = busy.last_active = time.monotonic() - 100
    await busy.lock.acquire()  # held by a running turn
    assert table.expired(50) == [old]
    assert fresh not in table.expired(50)
