"""The Anthropic Messages surface: `/v1/messages` and `/v1/messages/count_tokens`, per session.

Reachable as `/s/{session_id}/v1/messages` and as `/v1/messages` with the session's key in
`x-api-key` (the Anthropic SDK's header) or `Authorization: Bearer`. A request is translated
(`translate.py`) into the same chat turn as `/v1/chat/completions`, with surface
`messages`, and the turn's ChatCompletion or chunks are translated back. Every error on these
routes answers in Anthropic's error format (`{"type": "error", "error": {...}}`).
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
from rlgw.gateway.serving.flow import Surface, translated
from rlgw.gateway.serving.routing import EVENT_HEADER, session_for_key, session_for_path
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.anthropic import translate as at
from rlgw.gateway.surfaces.openai_chat import ChatCompletionRequest, chat_params, run_turn, stream_turn
from rlgw.gateway.turns.messages import ChatParams

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error JSON for an HTTP status."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


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
        return json_response(exc.status, error_body(exc.status, exc.message), headers=exc.headers)
    if isinstance(exc, ValidationError | RequestValidationError):
        # The OpenAI surfaces' message: the first problem, named by its field.
        return json_response(400, error_body(400, validation_message(exc)[0]))
    return None


router = APIRouter(route_class=AnthropicRoute)


def turn_params(req: at.MessagesInput, event: str | None = None) -> ChatParams:
    """The chat turn's parameters for an Anthropic request (validated as a chat request is)."""
    params = chat_params(ChatCompletionRequest.model_validate(at.chat_request(req)), event=event)
    params.surface = "messages"
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
        return turn_params(at.MessagesRequest.model_validate(body), request.headers.get(EVENT_HEADER))

    async def run(self, request: Request, session: Session, call: ChatParams) -> dict[str, Any]:
        """The Message."""
        state = request.app.state
        return at.message(await run_turn(state.backend, state.profile, session, call))

    def stream(self, request: Request, session: Session, call: ChatParams) -> AsyncIterator[dict[str, Any]]:
        """The Message's stream events, translated from the chat turn's chunks."""
        state = request.app.state
        return translated(stream_turn(state.backend, state.profile, session, call), at.MessageStream().feed)

    def stream_error(self, call: ChatParams, exc: APIError) -> bytes:
        """Anthropic's error event."""
        return named_event(error_body(exc.status, exc.message))


async def count_tokens(request: Request) -> Response:
    """`count_tokens`: the length of the prompt the conversation renders to (the template's count)."""
    req = at.MessagesInput.model_validate(await parse_body(request))
    params = turn_params(req)
    ids = request.app.state.profile.renderer.render_prompt(
        params.messages, params.tools, **params.template_kwargs
    )
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
