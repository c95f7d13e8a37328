"""The Anthropic Messages surface: `/v1/messages` and `/v1/messages/count_tokens`, per session.

Reachable as `/s/{session_id}/v1/messages` and as `/v1/messages` with the session's key in
`x-api-key` (the Anthropic SDK's header) or `Authorization: Bearer`. A request is translated
(`anthropic_translate`) into the same chat turn as `/v1/chat/completions`, with surface
`messages`, and the turn's ChatCompletion or chunks are translated back. Every error on these
routes answers in Anthropic's error format (`{"type": "error", "error": {...}}`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from rlgw.gateway import anthropic_translate as at
from rlgw.gateway.anthropic_errors import anthropic_error_body, error_body, error_headers, status_of
from rlgw.gateway.chat import ChatParams
from rlgw.gateway.errors import APIError, handle_validation_error, json_response
from rlgw.gateway.httpio import (
    EVENT_HEADER,
    cancel_on_disconnect,
    parse_body,
    session_for_key,
    session_for_path,
    session_routes,
    sse_stream,
)
from rlgw.gateway.mid_system import fold_mid_system, places_mid_system
from rlgw.gateway.openai_api import ChatCompletionRequest, chat_params, run_turn, stream_turn
from rlgw.gateway.render import ChatRenderer
from rlgw.gateway.sessions import Session
from rlgw.gateway.surface_sse import named_event, translate_chunks


class AnthropicRoute(APIRoute):
    """A route whose errors (the gateway's, and request validation) answer in Anthropic's format."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped to translate errors."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = await anthropic_error(request, exc)
                if response is None:
                    raise
                return response

        return route


async def anthropic_error(request: Request, exc: Exception) -> Response | None:
    """The gateway's errors and request validation errors in Anthropic's format (None: another
    exception, for the app's handlers)."""
    if isinstance(exc, APIError):
        return json_response(status_of(exc), anthropic_error_body(exc), headers=error_headers(exc))
    if isinstance(exc, ValidationError | RequestValidationError):
        # The OpenAI surfaces' message (the first problem, named by its field), re-shaped.
        openai = orjson.loads((await handle_validation_error(request, exc)).body)
        return json_response(400, error_body(400, openai["error"]["message"]))
    return None


router = APIRouter(route_class=AnthropicRoute)


def turn_params(
    req: at.MessagesInput, event: str | None = None, *, renderer: ChatRenderer | None = None
) -> ChatParams:
    """The chat turn's parameters for an Anthropic request (validated as a chat request is).

    Mid-conversation system messages stay where they are if `renderer`'s template places them,
    else they move into the adjacent user turn as Anthropic's fallback does (`mid_system.py`)."""
    body = at.chat_request(req)
    if renderer is not None and not places_mid_system(renderer):
        body["messages"] = fold_mid_system(body["messages"])
    params = chat_params(ChatCompletionRequest.model_validate(body), event=event)
    params.surface = "messages"
    return params


def _in_stream_error(exc: APIError) -> bytes:
    return named_event(anthropic_error_body(exc))


async def messages(request: Request, session: Session) -> Response:
    """Serve one Messages turn for `session` (streamed or not)."""
    state = request.app.state
    req = at.MessagesRequest.model_validate(await parse_body(request))
    params = turn_params(req, request.headers.get(EVENT_HEADER), renderer=state.profile.renderer)
    if not params.stream:
        doc = await cancel_on_disconnect(request, run_turn(state.backend, state.profile, session, params))
        return json_response(200, at.message(doc))
    chunks = stream_turn(state.backend, state.profile, session, params)
    # Enter the generator now, up to the engine's first answer: errors with a status surface
    # here (a client that leaves meanwhile cancels the turn); from here on the generator owns
    # the session lock and releases it in any case.
    first = await cancel_on_disconnect(request, chunks.__anext__())
    stream = at.MessageStream()
    head = stream.feed(first)
    return StreamingResponse(
        sse_stream(
            head[0],
            translate_chunks(head[1:], chunks, stream.feed),
            encode=named_event,
            error=_in_stream_error,
            done=b"",
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def count_tokens(request: Request) -> Response:
    """`count_tokens`: the length of the prompt the conversation renders to (the template's count)."""
    req = at.MessagesInput.model_validate(await parse_body(request))
    profile = request.app.state.profile
    params = turn_params(req, renderer=profile.renderer)
    ids = profile.renderer.render_prompt(params.messages, params.tools, **params.template_kwargs)
    return json_response(200, {"input_tokens": len(ids)})


@router.post("/s/{session_id}/v1/messages/count_tokens")
async def count_tokens_by_path(request: Request, session_id: str) -> Response:
    """Token count of a conversation, for the session named in the path."""
    session_for_path(request, session_id)
    return await count_tokens(request)


@router.post("/v1/messages/count_tokens")
async def count_tokens_by_key(request: Request) -> Response:
    """Token count of a conversation, for the session whose key is sent."""
    session_for_key(request)
    return await count_tokens(request)


session_routes(router, "/messages", messages, "messages", errors=anthropic_error)
