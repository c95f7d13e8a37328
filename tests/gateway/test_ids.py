"""Fresh ids (engine request ids, response ids, tool-call ids): unique in a process and across processes."""

from __future__ import annotations

import os

from rlgw.gateway.engine_client.backend import new_rid
from rlgw.gateway.ids import fresh_hex
from rlgw.gateway.turns.messages import tool_call_id


def test_ids_are_unique_and_keep_their_shapes() -> None:
    ids = [new_rid() for _ in range(10_000)] + [fresh_hex() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    calls = [tool_call_id() for _ in range(10_000)]
    assert len(set(calls)) == len(calls)
    assert all(c.startswith("call_") and len(c) == 29 for c in calls)  # OpenAI's shape, as before


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    fresh_hex()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, as the parent's next would be drawn
        os.write(write, ",".join(fresh_hex() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split(",")
    os.waitpid(pid, 0)
    os.close(read)
    parent = [fresh_hex() for _ in range(3)]
    assert not set(child) & set(parent)
    assert child[0][:16] != parent[0][:16]  # the child drew its own process part
