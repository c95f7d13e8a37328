"""HTTP helpers every API surface shares: session lookup by path or key, the JSON body, SSE,
and tying a non-streamed turn to its client's connection.

It knows nothing about any surface's request or response shapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from rlgw.gateway.errors import APIError, AuthError, ClientDisconnected, InvalidRequest
from rlgw.gateway.http.body_limits import check_counts
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.tenancy.tenants import bearer_key

T = TypeVar("T")

EVENT_HEADER = "x-rlgw-event"  # a segment cause the agent states (compaction, summarization, ...)


SessionHandler = Callable[[Request, Session], Awaitable[Response]]
# A surface's own error format: the response for an exception, or None for the app's handlers.
ErrorFormat = Callable[[Request, Exception], Awaitable[Response | None]]


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """One surface's turn endpoint (`path` under `/v1`), as the edge serves it."""

    path: str
    handler: SessionHandler
    errors: ErrorFormat | None = None

    @property
    def by_path(self) -> str:
        """The route template with the session in the path (also the metrics label)."""
        return f"/s/{{session_id}}/v1{self.path}"

    @property
    def by_key(self) -> str:
        """The route template for a session named by its key."""
        return f"/v1{self.path}"


# Every surface's turn endpoint, by path under /v1; filled as the surface modules are imported.
SESSION_ROUTES: dict[str, SessionRoute] = {}


def session_routes(
    router: APIRouter, path: str, handler: SessionHandler, name: str, *, errors: ErrorFormat | None = None
) -> None:
    """Serve `handler` for a session two ways: `POST /s/{session_id}/v1{path}` (the session named
    in the path; for agents that only let you set a base URL) and `POST /v1{path}` (the session
    whose key is sent; for agents that only let you set a key).

    The routes are registered on `router` (the OpenAPI document, and any app without the
    edge) and in `SESSION_ROUTES`, from which the edge serves them directly.
    """
    route = SessionRoute(path, handler, errors)
    SESSION_ROUTES[path] = route

    async def by_path(request: Request, session_id: str) -> Response:
        return await handler(request, session_for_path(request, session_id))

    async def by_key(request: Request) -> Response:
        return await handler(request, session_for_key(request))

    doc = (handler.__doc__ or "").strip().splitlines()[0] if handler.__doc__ else name
    router.add_api_route(route.by_path, by_path, methods=["POST"], name=f"{name}_by_path", description=doc)
    router.add_api_route(route.by_key, by_key, methods=["POST"], name=f"{name}_by_key", description=doc)


def session_for_path(request: Request, session_id: str) -> Session:
    """The open session named in the path; the caller must hold its key or its tenant's key.

    On a gateway with no tenant keys (the one-machine default) the unguessable session id in
    the path is the credential, so agents that send a placeholder key still work. Otherwise the
    key is checked before the session is looked up: a wrong key gets the same 401 whether the
    session exists or not, and a tenant gets the same 404 for another tenant's session as for none.
    """
    state = request.app.state
    if len(state.tenant_keys) == 0:
        return state.sessions.get_open(session_id)
    key = bearer_key(request)
    tenant = state.tenant_keys.owner(key) if key else None
    if tenant is not None:
        return state.sessions.get_open(session_id, tenant)
    session = state.sessions.by_key(key) if key else None
    if session is None or session.id != session_id:
        raise AuthError("this session needs its API key (or its tenant's key) as the bearer token")
    return state.sessions.get_open(session_id)


def session_for_key(request: Request) -> Session:
    """The session whose API key is the bearer token."""
    key = bearer_key(request)
    session = request.app.state.sessions.by_key(key) if key else None
    if session is None:
        raise AuthError("use a session's API key (POST /v1/sessions), or the base URL /s/{session_id}/v1")
    return request.app.state.sessions.get_open(session.id)


async def parse_body(request: Request) -> dict[str, Any]:
    """The JSON object body of a request (400 if it is not one, or if it carries more messages or
    tools than the gateway's caps allow)."""
    try:
        doc = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    check_counts(doc, request.app.state.request_caps)
    return doc


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def sse_stream(
    first: dict[str, Any],
    rest: AsyncIterator[dict[str, Any]],
    *,
    encode: Callable[[dict[str, Any]], bytes] = _sse,
    error: Callable[[APIError], bytes] | None = None,
    done: bytes = b"data: [DONE]\n\n",
) -> AsyncIterator[bytes]:
    """SSE events for `first` and the rest; an error after the first byte travels in-stream.

    `encode` writes one event (OpenAI's `data:` lines by default; surfaces with named events
    pass their own), `error` an in-stream error, `done` the closing line (b"" for none).
    """
    yield encode(first)
    try:
        async for chunk in rest:
            yield encode(chunk)
    except APIError as exc:
        # After the first byte the status line is gone: errors travel in-stream.
        yield error(exc) if error is not None else encode(exc.body())
    if done:
        yield done


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
