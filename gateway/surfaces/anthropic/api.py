"""The Anthropic Messages surface: `/v1/messages` and `/v1/messages/count_tokens`, per session.

Reachable as `/s/{session_id}/v1/messages` and as `/v1/messages` with the session's key in
`x-api-key` (the Anthropic SDK's header) or `Authorization: Bearer`. A request is validated as
`MessagesRequest` and translated (`translate.py`) straight into the same chat turn as
`/v1/chat/completions`, with surface `messages`; the finished turn, or its streamed items, are
translated back. Every error on these routes answers in Anthropic's error format
(`{"type": "error", "error": {...}}`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.responses import Response

from rlgw.gateway.errors import APIError
from rlgw.gateway.http.body_limits import parse_body
from rlgw.gateway.http.errors import json_response, validation_message
from rlgw.gateway.http.sse import named_event
from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.serving.flow import Surface, translated
from rlgw.gateway.serving.routing import EVENT_HEADER, session_for_key, session_for_path
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.anthropic import translate as at
from rlgw.gateway.surfaces.anthropic.errors import anthropic_error_body, error_body, error_headers, status_of
from rlgw.gateway.surfaces.anthropic.mid_system import fold_mid_system, places_mid_system
from rlgw.gateway.turns.messages import ChatParams, run_chat, stream_chat


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
        # The OpenAI surfaces' message: the first problem, named by its field.
        return json_response(400, error_body(400, validation_message(exc)[0]))
    return None


router = APIRouter(route_class=AnthropicRoute)


def turn_params(
    req: at.MessagesInput, event: str | None = None, *, renderer: ChatRenderer | None = None
) -> ChatParams:
    """The chat turn's parameters for an Anthropic request.

    Mid-conversation system messages stay where they are if `renderer`'s template places them,
    else they move into the adjacent user turn as Anthropic's fallback does (`mid_system.py`)."""
    params = at.turn_params(req, event)
    if renderer is not None and not places_mid_system(renderer):
        params.messages = fold_mid_system(params.messages)
    return params


class AnthropicMessages(Surface[ChatParams]):
    """Anthropic Messages: translated into the chat turn and back, errors in Anthropic's format."""

    path = "/messages"
    name = "messages"
    summary = "Serve one Messages turn for `session` (streamed or not)."
    done = b""
    encode = staticmethod(named_event)  # named events
    error_format = staticmethod(anthropic_error)

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> ChatParams:
        """The request validated and translated into the chat turn's parameters."""
        req = at.MessagesRequest.model_validate(body)
        return turn_params(
            req, request.headers.get(EVENT_HEADER), renderer=request.app.state.profile.renderer
        )

    async def run(self, request: Request, session: Session, call: ChatParams) -> dict[str, Any]:
        """The Message."""
        state = request.app.state
        return at.message(await run_chat(state.backend, state.profile, session, call), state.profile.name)

    def stream(self, request: Request, session: Session, call: ChatParams) -> AsyncIterator[dict[str, Any]]:
        """The Message's stream events, translated from the chat turn's items."""
        state = request.app.state
        stream = at.MessageStream(state.profile.name)
        return translated(stream_chat(state.backend, state.profile, session, call), stream.feed)

    def stream_error(self, call: ChatParams, exc: APIError) -> bytes:
        """Anthropic's error event."""
        return named_event(anthropic_error_body(exc))


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


AnthropicMessages().register(router)
