"""The OpenAI Responses surface: `/v1/responses`, per session.

Reachable as `/s/{session_id}/v1/responses` and as `/v1/responses` with the session's key as
the bearer token. A request's items (after those of `previous_response_id`, which the session
holds) are translated (`responses_translate`) into the same chat turn as `/v1/chat/completions`,
with surface `responses`; the turn's ChatCompletion or chunks are translated back. Errors use
OpenAI's format, the gateway's default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from rlgw.gateway import responses_translate as rt
from rlgw.gateway.chat import ChatParams
from rlgw.gateway.errors import APIError, InvalidRequest, json_response
from rlgw.gateway.httpio import (
    EVENT_HEADER,
    cancel_on_disconnect,
    parse_body,
    session_routes,
    sse_stream,
)
from rlgw.gateway.openai_api import ChatCompletionRequest, chat_params, run_turn, stream_turn
from rlgw.gateway.sessions import Session
from rlgw.gateway.surface_sse import named_event, translate_chunks

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


def turn_params(req: rt.ResponsesRequest, items: list[dict[str, Any]], event: str | None) -> ChatParams:
    """The chat turn's parameters for a Responses request over `items` (validated as chat is)."""
    params = chat_params(ChatCompletionRequest.model_validate(rt.chat_request(req, items)), event=event)
    params.surface = "responses"
    if dropped := rt.hosted_tools(req.tools):
        params.notes["dropped_tools"] = dropped
    return params


def remember(session: Session, req: rt.ResponsesRequest, items: list[dict[str, Any]], doc: dict) -> None:
    """Keep the conversation up to this response for a later `previous_response_id` (if `store`)."""
    if req.store:
        session.conversations[doc["id"]] = [*items, *doc["output"]]


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


async def responses(request: Request, session: Session) -> Response:
    """Serve one Responses turn for `session` (streamed or not)."""
    state = request.app.state
    req = rt.ResponsesRequest.model_validate(await parse_body(request))
    items = conversation(session, req)
    params = turn_params(req, items, request.headers.get(EVENT_HEADER))
    if not params.stream:
        completion = await cancel_on_disconnect(
            request, run_turn(state.backend, state.profile, session, params)
        )
        doc = rt.response(req, completion)
        remember(session, req, items, doc)
        return json_response(200, doc)
    chunks = stream_turn(state.backend, state.profile, session, params)
    # Enter the generator now, up to the engine's first answer: errors with a status surface
    # here (a client that leaves meanwhile cancels the turn); from here on the generator owns
    # the session lock and releases it in any case.
    first = await cancel_on_disconnect(request, chunks.__anext__())
    stream = rt.ResponseStream(req)
    head = stream.feed(first)
    events = _remembered(translate_chunks(head[1:], chunks, stream.feed), stream, session, req, items)
    return StreamingResponse(
        sse_stream(head[0], events, encode=named_event, error=partial(_failed, stream), done=b""),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _failed(stream: rt.ResponseStream, exc: APIError) -> bytes:
    return b"".join(named_event(e) for e in stream.fail(exc.body()["error"]))


session_routes(router, "/responses", responses, "responses")
