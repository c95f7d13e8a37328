"""The surfaces' turn routes: their registry (which the edge serves directly), and the session a
turn is for, found by the path or by the key.

It knows nothing about any surface's request or response shapes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import APIRouter, Request
from starlette.responses import Response

from rlgw.gateway.errors import AuthError
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.tenancy.tenants import bearer_key

T = TypeVar("T")

EVENT_HEADER = "x-rlgw-event"  # a segment cause the agent states (compaction, summarization, ...)


SessionHandler = Callable[[Request, Session], Awaitable[Response]]
# A surface's own error format: the response for an exception, or None for the app's handlers.
ErrorFormat = Callable[[Request, Exception], Awaitable[Response | None]]


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """One surface's turn endpoint (`path` under `/{version}`), as the edge serves it."""

    path: str
    handler: SessionHandler
    errors: ErrorFormat | None = None
    version: str = "v1"

    @property
    def by_path(self) -> str:
        """The route template with the session in the path (also the metrics label)."""
        return f"/s/{{session_id}}/{self.version}{self.path}"

    @property
    def by_key(self) -> str:
        """The route template for a session named by its key."""
        return f"/{self.version}{self.path}"


# Every surface's turn endpoint, by its key route's template (`SessionRoute.by_key`, which
# `route_key` gives for a request's path); filled as the surface modules are imported.
SESSION_ROUTES: dict[str, SessionRoute] = {}

MODEL_SEGMENT = "/models/"


def route_key(path: str) -> str:
    """The `SESSION_ROUTES` key of a request path after its `/s/{session_id}` (if any): the path
    itself, or for Gemini's `/{version}/models/{model}:{method}` the template, whatever the model
    (its name may hold slashes)."""
    head, colon, method = path.rpartition(":")
    if colon:
        version, models, _model = head.partition(MODEL_SEGMENT)
        if models and "/" not in version[1:]:
            return f"{version}{MODEL_SEGMENT}{{model}}:{method}"
    return path


def session_routes(
    router: APIRouter,
    path: str,
    handler: SessionHandler,
    name: str,
    *,
    errors: ErrorFormat | None = None,
    doc: str | None = None,
    version: str = "v1",
) -> None:
    """Serve `handler` for a session two ways: `POST /s/{session_id}/{version}{path}` (the session
    named in the path; for agents that only let you set a base URL) and `POST /{version}{path}`
    (the session whose key is sent; for agents that only let you set a key).

    The routes are registered on `router` (the OpenAPI document, and any app without the
    edge) and in `SESSION_ROUTES`, from which the edge serves them directly.
    """
    route = SessionRoute(path, handler, errors, version)
    SESSION_ROUTES[route.by_key] = route

    async def by_path(request: Request, session_id: str) -> Response:
        return await handler(request, session_for_path(request, session_id))

    async def by_key(request: Request) -> Response:
        return await handler(request, session_for_key(request))

    if doc is None:
        doc = (handler.__doc__ or "").strip().splitlines()[0] if handler.__doc__ else name
    if version != "v1":
        name = f"{name}_{version}"
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
