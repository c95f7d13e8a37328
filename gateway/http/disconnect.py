"""Tying a non-streamed turn to its client's connection: a client that leaves cancels the turn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from rlgw.gateway.errors import ClientDisconnected

T = TypeVar("T")


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first.

    Starlette lets a non-streamed handler run on after its client is gone; here that would
    keep the engine generating for nobody. Cancelling the turn aborts its engine request and
    leaves the ledger untouched. `work` runs in the caller's task; one watcher task cancels
    that task when the client leaves (a second task per turn and `asyncio.wait` cost more).
    """
    task = asyncio.current_task()
    assert task is not None
    state = {"done": False, "gone": False}

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if not state["done"]:
            state["gone"] = True
            task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
        state["done"] = True
        return result
    except asyncio.CancelledError:
        state["done"] = True
        # Our own cancel (and no one else's pending): the client left.
        if state["gone"] and task.uncancel() == 0:
            raise ClientDisconnected("the client disconnected before the reply was ready") from None
        raise
    finally:
        watcher.cancel()
