"""The gateway's edge: the one ASGI layer every request passes, and the turn endpoints served
without FastAPI's routing.

Every request is metered (`metrics`), has its body capped (`body_limits`) and runs with the
app's `LimitTable` bound (`limits`): one layer, where three wrapped middlewares each cost a
frame and a wrapped `send` per message. The turn endpoints (each surface's
`POST /s/{session_id}/v1/<path>` and `POST /v1/<path>`, or another API version's, registered by
`routing.session_routes`)
are the hot path, hundreds a second: they are matched here by a dict lookup and their handler
is called directly, skipping FastAPI's router, dependency solving and exception middleware
(measured by `bench/gateway.py`), and a turn settles (its record applied to the ledger, the
session released) once its reply is sent. The edge wraps FastAPI's whole middleware stack (`app.py`),
so a turn skips its server-error, telemetry and body-limit layers too. FastAPI still holds the
same routes (the OpenAPI document), and errors are answered by the same handlers, so a client
cannot tell the two paths apart. Everything else goes to FastAPI.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rlgw.gateway import metrics
from rlgw.gateway.http import body_limits
from rlgw.gateway.serving.routing import SessionRoute, route_key, session_for_key, session_for_path
from rlgw.gateway.tenancy import limits
from rlgw.gateway.turns.lifecycle import settle_after_reply

ASGIApp = Callable[..., Any]


class Edge:
    """Pure ASGI middleware: meters, caps and binds limits for every request; serves the turn
    endpoints of `routes` (`SessionRoute.by_key` template -> route) itself."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        table: limits.LimitTable,
        max_body_bytes: int | None,
        routes: Mapping[str, SessionRoute],
    ) -> None:
        self.app = app
        self.table = table
        self.max_body_bytes = max_body_bytes
        self.routes = routes

    def match(self, method: str, path: str) -> tuple[SessionRoute | None, str | None]:
        """The turn route of a request and the session id in its path (None: named by its key)."""
        if method != "POST":
            return None, None
        if not path.startswith("/s/"):
            return self.routes.get(route_key(path)), None
        session_id, _, rest = path[3:].partition("/")
        if not session_id:
            return None, None
        return self.routes.get(route_key("/" + rest)), session_id

    async def __call__(self, scope: dict[str, Any], receive: ASGIApp, send: ASGIApp) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        clock, clock_token = metrics.start_request()
        limits_token = limits.bind(self.table)
        route, session_id = self.match(scope["method"], scope["path"])
        label = None if route is None else route.by_key if session_id is None else route.by_path
        status = 500  # an exception escaping the app is answered 500 by the server

        async def metered_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            cap = self.max_body_bytes
            if cap is not None:
                if body_limits.declared_over(scope, cap):
                    await body_limits.send_413(metered_send, cap)
                    return
                receive = body_limits.capped(receive, cap)
            if route is None:
                await self.app(scope, receive, metered_send)
            else:
                await self._turn(route, session_id, scope, receive, metered_send)
        finally:
            limits.unbind(limits_token)
            label = label or metrics.route_of(scope)
            metrics.finish_request(
                clock_token, clock, label, scope["method"], status, time.perf_counter() - start
            )

    async def _turn(
        self,
        route: SessionRoute,
        session_id: str | None,
        scope: dict[str, Any],
        receive: ASGIApp,
        send: ASGIApp,
    ) -> None:
        request = Request(scope, receive)
        # The turn's bookkeeping after its journal write waits until the reply is sent (turn.py).
        with settle_after_reply():
            try:
                if session_id is None:
                    session = session_for_key(request)
                else:
                    session = session_for_path(request, session_id)
                response = await route.handler(request, session)
            except Exception as exc:
                response = await self._error(route, request, exc)
            await response(scope, receive, send)

    async def _error(self, route: SessionRoute, request: Request, exc: Exception) -> Response:
        """The response FastAPI would give: the surface's error format, else the app's handler
        for the nearest class of `exc`; an exception nobody handles propagates (500)."""
        if route.errors is not None:
            response = await route.errors(request, exc)
            if response is not None:
                return response
        handlers = request.app.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                return await handler(request, exc)
        raise exc
