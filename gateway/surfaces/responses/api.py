"""The OpenAI Responses surface: `/v1/responses`, per session.

Reachable as `/s/{session_id}/v1/responses` and as `/v1/responses` with the session's key as
the bearer token. A request's items (after those of `previous_response_id`, which the session
holds) are translated (`translate.py`) straight into the same chat turn as
`/v1/chat/completions`, with surface `responses`; the finished turn, or its streamed items, are
translated back. Errors use OpenAI's format, the gateway's default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request

from rlgw.gateway.errors import APIError, InvalidRequest
from rlgw.gateway.http.sse import named_event
from rlgw.gateway.serving.flow import Surface, translated
from rlgw.gateway.serving.routing import EVENT_HEADER
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.responses import translate as rt
from rlgw.gateway.turns.messages import ChatParams, run_chat, stream_chat

router = APIRouter()


def conversation(session: Session, req: rt.ResponsesRequest) -> list[dict[str, Any]]:
    """All items of the conversation: those of `previous_response_id`, then the request's."""
    items = rt.input_items(req.input)
    if req.previous_response_id is None:
        return items
    earlier = session.conversations.get(req.previous_response_id)
    if earlier is None:
        raise InvalidRequest(
            f"Previous response with id {req.previous_response_id!r} not found in this session.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return [*earlier, *items]


def remember(session: Session, req: rt.ResponsesRequest, items: list[dict[str, Any]], doc: dict) -> None:
    """Keep the conversation up to this response for a later `previous_response_id` (if `store`)."""
    if req.store:
        session.conversations[doc["id"]] = [*items, *doc["output"]]


@dataclass(slots=True)
class ResponsesCall:
    """An accepted Responses request: the request, the conversation's items, the chat turn's parameters."""

    req: rt.ResponsesRequest
    items: list[dict[str, Any]]
    params: ChatParams
    translator: rt.ResponseStream | None = None  # a streamed turn's translation, once it started

    @property
    def stream(self) -> bool:
        """Whether the agent asked for a stream."""
        return self.params.stream


class Responses(Surface[ResponsesCall]):
    """OpenAI Responses: translated into the chat turn and back; the session keeps stored
    conversations for `previous_response_id`."""

    path = "/responses"
    name = "responses"
    summary = "Serve one Responses turn for `session` (streamed or not)."
    done = b""
    encode = staticmethod(named_event)  # named events

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> ResponsesCall:
        """The request validated, its conversation gathered and translated into the chat turn."""
        req = rt.ResponsesRequest.model_validate(body)
        items = conversation(session, req)
        return ResponsesCall(req, items, rt.turn_params(req, items, request.headers.get(EVENT_HEADER)))

    async def run(self, request: Request, session: Session, call: ResponsesCall) -> dict[str, Any]:
        """The Response (remembered if `store`)."""
        state = request.app.state
        turn = await run_chat(state.backend, state.profile, session, call.params)
        doc = rt.response(call.req, turn, state.profile.name)
        remember(session, call.req, call.items, doc)
        return doc

    def stream(
        self, request: Request, session: Session, call: ResponsesCall
    ) -> AsyncIterator[dict[str, Any]]:
        """The Response's stream events, translated from the chat turn's items (the finished
        Response remembered once the stream ends)."""
        state = request.app.state
        call.translator = stream = rt.ResponseStream(call.req, state.profile.name)
        events = translated(stream_chat(state.backend, state.profile, session, call.params), stream.feed)
        return _remembered(events, stream, session, call.req, call.items)

    def stream_error(self, call: ResponsesCall, exc: APIError) -> bytes:
        """The stream's `response.failed` (and what it closes), as named events."""
        assert call.translator is not None
        return b"".join(named_event(e) for e in call.translator.fail(exc.body()["error"]))


async def _remembered(
    events: AsyncIterator[dict[str, Any]],
    stream: rt.ResponseStream,
    session: Session,
    req: rt.ResponsesRequest,
    items: list[dict[str, Any]],
) -> AsyncIterator[dict[str, Any]]:
    async for event in events:
        yield event
    if stream.response is not None:
        remember(session, req, items, stream.response)


Responses().register(router)
