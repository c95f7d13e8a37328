"""One serving flow for every API surface: read the body, validate it into the internal turn, then
answer whole or streamed, with errors in the surface's own format.

sglang's `OpenAIServingBase.handle_request` and slime's `BaseAdapter` are the model: a surface is a
`Surface` subclass that fills in its wire format's hooks, and this module owns the order they run
in, tying a non-streamed turn to its client's connection, the SSE response and its headers. A new
API is one subclass. This module knows no surface's request or response shapes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from rlgw.gateway.errors import APIError
from rlgw.gateway.http.body_limits import parse_body
from rlgw.gateway.http.disconnect import cancel_on_disconnect
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.http.sse import data_event, sse_stream
from rlgw.gateway.serving.routing import ErrorFormat, session_routes
from rlgw.gateway.sessions.table import Session

# A stream's events must reach the agent as they are written (no proxy buffering, no caching).
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Call(Protocol):
    """A request a surface accepted: whatever its hooks need, and whether it streams."""

    @property
    def stream(self) -> bool:
        """Whether the agent asked for a stream."""
        ...


CallT = TypeVar("CallT", bound=Call)


class Surface(Generic[CallT]):
    """One API's wire format over the shared flow (`handle`).

    Hooks: `accept` (validate the JSON body into a call; every refusal here has an HTTP status),
    `run` (a non-streamed turn's reply document), `stream` (a streamed turn's events; what it
    raises before its first event still has a status) and, for the stream's framing, `encode`,
    `stream_error` and `done`. `error_format` answers errors in the API's own format (None: the
    app's OpenAI-shaped handlers).
    """

    path: ClassVar[str]  # the turn endpoint under each of `versions`
    versions: ClassVar[tuple[str, ...]] = ("v1",)  # the API versions it is served under
    name: ClassVar[str]  # the routes' name prefix
    summary: ClassVar[str]  # the OpenAPI description
    done: ClassVar[bytes] = b"data: [DONE]\n\n"  # the stream's closing line (b"": none)
    error_format: ClassVar[ErrorFormat | None] = None

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> CallT:
        """Validate the body into a call (raises `APIError`s and pydantic's `ValidationError`)."""
        raise NotImplementedError

    async def run(self, request: Request, session: Session, call: CallT) -> dict[str, Any]:
        """The reply document of a non-streamed turn."""
        raise NotImplementedError

    def stream(self, request: Request, session: Session, call: CallT) -> AsyncIterator[dict[str, Any]]:
        """The events of a streamed turn; from its first event on it holds the session until closed."""
        raise NotImplementedError

    def encode(self, event: dict[str, Any]) -> bytes:
        """One event's SSE bytes (OpenAI's `data:` lines)."""
        return data_event(event)

    def stream_error(self, call: CallT, exc: APIError) -> bytes:
        """An error after the stream started, in-stream (OpenAI's error body as an event)."""
        return self.encode(exc.body())

    async def handle(self, request: Request, session: Session) -> Response:
        """Serve one turn for `session`, streamed or not."""
        call = self.accept(request, session, await parse_body(request))
        if not call.stream:
            doc = await cancel_on_disconnect(request, self.run(request, session, call))
            return json_response(200, doc)
        events = self.stream(request, session, call)
        # Enter the stream now, up to the engine's first answer: errors with a status surface
        # here (a client that leaves meanwhile cancels the turn); from here on the stream owns
        # the session lock and releases it in any case.
        first = await cancel_on_disconnect(request, events.__anext__())
        body = sse_stream(
            first, events, encode=self.encode, error=partial(self.stream_error, call), done=self.done
        )
        return StreamingResponse(body, media_type="text/event-stream", headers=STREAM_HEADERS)

    def register(self, router: APIRouter) -> None:
        """Serve this surface's turn endpoint by session path and by session key, per version."""
        for version in self.versions:
            session_routes(
                router,
                self.path,
                self.handle,
                self.name,
                errors=self.error_format,
                doc=self.summary,
                version=version,
            )


async def translated(
    chunks: AsyncIterator[dict[str, Any]], feed: Callable[[dict[str, Any]], list[dict[str, Any]]]
) -> AsyncIterator[dict[str, Any]]:
    """The events `feed` makes of each chunk of `chunks`, one chunk possibly becoming several: the
    stream of a surface that is translated from another's chunks. Whatever awaiting the first
    chunk raises, awaiting the first event raises."""
    async for chunk in chunks:
        for event in feed(chunk):
            yield event
