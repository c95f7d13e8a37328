"""HTTP read side of the trajectory store: `GET /v1/trajectories` (NDJSON, long poll) and one by cursor.

This module owns the query parameters, the NDJSON wire form and tenant scoping of reads.
It does not own storage (`store.TrajectoryStore`, found at `request.app.state.store`),
authentication (`tenants.require_tenant`) or the error-body shape (`errors.APIError` and
the app's handlers).

Following the stream: read lines, remember the last `cursor`, ask again with
`after=<that cursor>`. Cursors are committed in increasing order (one writer lock), so a
cursor once passed is never filled in later and nothing is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from rlgw.gateway.errors import InvalidRequest, NotFound
from rlgw.gateway.tenancy.tenants import require_tenant
from rlgw.gateway.trajectories.store import StoredSample, TrajectoryStore

router = APIRouter()

MAX_LIMIT = 1000
MAX_WAIT_S = 60.0
# Rows decoded and serialized per step while streaming: bounds memory for long samples
# (a 32k-token sample is about 0.5 MB of JSON) while keeping per-step overhead small.
PAGE_ROWS = 16


def _bad_param(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_parameter")


# Cursors are SQLite rowids (int64): a larger number names no sample (and must not reach SQLite).
MAX_CURSOR = 2**63 - 1


def _int_param(name: str, raw: str | None, default: int, lo: int, hi: int | None = None) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad_param(name, f"'{name}' must be an integer, got {raw!r}.") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise _bad_param(name, f"'{name}' must be {bound}, got {value}.")
    return value


def _wait_param(raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise _bad_param("wait", f"'wait' must be a number of seconds, got {raw!r}.") from None
    if not value >= 0:  # also rejects NaN
        raise _bad_param("wait", f"'wait' must be >= 0, got {raw}.")
    # A long poll longer than this only risks proxies' idle timeouts; clients simply ask again.
    return min(value, MAX_WAIT_S)


def _ndjson(samples: list[StoredSample]) -> bytes:
    return b"".join(s.to_json() for s in samples)


@router.get("/v1/trajectories")
async def list_trajectories(
    request: Request,
    after: str | None = None,
    limit: str | None = None,
    wait: str | None = None,
    tenant: str = Depends(require_tenant),
) -> StreamingResponse:
    """The caller's samples with cursor > `after`, oldest first, as NDJSON (at most `limit` lines).

    With `wait` > 0 (seconds, capped at 60) and nothing after the cursor yet, the answer is
    held until a sample arrives or the wait runs out (then the body is empty).
    """
    after_v = _int_param("after", after, 0, 0, MAX_CURSOR)
    limit_v = _int_param("limit", limit, 100, 1, MAX_LIMIT)
    wait_v = _wait_param(wait)
    store: TrajectoryStore = request.app.state.store

    async def body() -> AsyncIterator[bytes]:
        # The wait happens inside the body so that a client hanging up cancels it
        # (StreamingResponse watches for the disconnect while the body runs).
        if wait_v > 0:
            await store.wait(tenant, after=after_v, timeout=wait_v)
        sent, cursor = 0, after_v
        while sent < limit_v:
            page = await store.list(tenant, after=cursor, limit=min(PAGE_ROWS, limit_v - sent))
            if not page:
                return
            yield await asyncio.to_thread(_ndjson, page)
            sent += len(page)
            cursor = page[-1].cursor

    return StreamingResponse(body(), media_type="application/x-ndjson", headers={"Cache-Control": "no-store"})


@router.get("/v1/trajectories/{cursor}")
async def get_trajectory(request: Request, cursor: str, tenant: str = Depends(require_tenant)) -> Response:
    """One of the caller's samples by cursor, as JSON; 404 if absent or another tenant's."""
    cursor_v = _int_param("cursor", cursor, 0, 1, MAX_CURSOR)
    store: TrajectoryStore = request.app.state.store
    stored = await store.get(tenant, cursor_v)
    if stored is None:
        # Same answer for "absent" and "someone else's": existence is not leaked across tenants.
        raise NotFound(f"No trajectory with cursor {cursor_v}.", param="cursor", code="trajectory_not_found")
    body = await asyncio.to_thread(stored.to_json)
    return Response(content=body, media_type="application/json")
