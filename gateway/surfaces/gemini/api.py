"""The Gemini API surface: `models/{model}:generateContent`, `:streamGenerateContent` and
`:countTokens`, per session.

Reachable under both API versions the clients use, `v1beta` (Gemini CLI, `@google/genai`) and
`v1` (the `google-genai` SDK's default): `/s/{session_id}/{version}/models/{model}:...` (a base
URL of `{gateway}/s/{session_id}`) and `/{version}/models/{model}:...` with the session's key
in `x-goog-api-key` (the SDKs' header) or `?key=`. The model in the path is not checked: the
gateway serves one model. A request is validated as `GenerateContentRequest` and translated
(`translate.py`) straight into the same chat turn as `/v1/chat/completions`, with surface
`gemini`; the finished turn, or its streamed items, are translated back. A stream is SSE
(`?alt=sse`, what every client asks for). Every error on these routes answers in Gemini's
format (`{"error": {"code", "message", "status"}}`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from rlgw.gateway.errors import APIError, InvalidRequest
from rlgw.gateway.http.body_limits import parse_body
from rlgw.gateway.http.errors import json_response, validation_message
from rlgw.gateway.serving.flow import Surface, translated
from rlgw.gateway.serving.routing import EVENT_HEADER, session_for_key, session_for_path
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.gemini import translate as gt
from rlgw.gateway.surfaces.gemini.errors import error_body, gemini_error_body
from rlgw.gateway.turns.messages import ChatParams, run_chat, stream_chat

router = APIRouter()


async def gemini_error(request: Request, exc: Exception) -> Response | None:
    """The gateway's errors, request validation and HTTP errors (a body over the cap) in
    Gemini's format (None: another exception, for the app's handlers)."""
    if isinstance(exc, APIError):
        return json_response(exc.status, gemini_error_body(exc), headers=exc.headers)
    if isinstance(exc, ValidationError | RequestValidationError):
        return json_response(400, error_body(400, validation_message(exc)[0]))
    if isinstance(exc, HTTPException):
        detail = exc.detail.get("message") if isinstance(exc.detail, dict) else exc.detail
        return json_response(exc.status_code, error_body(exc.status_code, str(detail)), headers=exc.headers)
    return None


@dataclass(slots=True)
class GeminiCall:
    """An accepted Gemini request: the chat turn's parameters and how to answer it."""

    params: ChatParams
    thoughts: bool  # return the reasoning as thought parts (`includeThoughts`)

    @property
    def stream(self) -> bool:
        """Whether this is `streamGenerateContent`."""
        return self.params.stream


class GenerateContent(Surface[GeminiCall]):
    """`generateContent`: translated into the chat turn and back, errors in Gemini's format."""

    path = "/models/{model}:generateContent"
    versions = ("v1beta", "v1")
    name = "gemini_generate"
    summary = "Serve one Gemini generateContent turn for `session`."
    error_format = staticmethod(gemini_error)
    streams: ClassVar[bool] = False

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> GeminiCall:
        """The request validated and translated into the chat turn's parameters."""
        req = gt.GenerateContentRequest.model_validate(body)
        params = gt.turn_params(req, stream=self.streams, event=request.headers.get(EVENT_HEADER))
        return GeminiCall(params, gt.include_thoughts(req))

    async def run(self, request: Request, session: Session, call: GeminiCall) -> dict[str, Any]:
        """The GenerateContentResponse."""
        state = request.app.state
        turn = await run_chat(state.backend, state.profile, session, call.params)
        return gt.response(turn, state.profile.name, thoughts=call.thoughts)


class StreamGenerateContent(GenerateContent):
    """`streamGenerateContent?alt=sse`: the turn's chunks as server-sent events."""

    path = "/models/{model}:streamGenerateContent"
    name = "gemini_stream"
    summary = "Stream one Gemini generateContent turn for `session` (`?alt=sse`)."
    done = b""
    streams = True

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> GeminiCall:
        """As `generateContent`; the stream must be SSE (a JSON array stream is not served)."""
        if request.query_params.get("alt") != "sse":
            raise InvalidRequest("streamGenerateContent is served as server-sent events: add ?alt=sse")
        return super().accept(request, session, body)

    def stream(self, request: Request, session: Session, call: GeminiCall) -> AsyncIterator[dict[str, Any]]:
        """The response's chunks, translated from the chat turn's items."""
        state = request.app.state
        chunks = gt.ResponseStream(state.profile.name, thoughts=call.thoughts)
        return translated(stream_chat(state.backend, state.profile, session, call.params), chunks.feed)

    def stream_error(self, call: GeminiCall, exc: APIError) -> bytes:
        """Gemini's error body as an event."""
        return self.encode(gemini_error_body(exc))


async def count_tokens(request: Request, find: Callable[[], Session]) -> Response:
    """`countTokens`: the length of the prompt the request renders to (the template's count), for
    a `{contents, ...}` body or one that wraps a `generateContentRequest`; errors in Gemini's format."""
    try:
        find()
        body = await parse_body(request)
        req = gt.GenerateContentRequest.model_validate(body.get("generateContentRequest", body))
        params = gt.turn_params(req, stream=False)
        renderer = request.app.state.profile.renderer
        ids = renderer.render_prompt(params.messages, params.tools, **params.template_kwargs)
    except Exception as exc:
        response = await gemini_error(request, exc)
        if response is None:
            raise
        return response
    return json_response(200, {"totalTokens": len(ids)})


def _count_tokens_routes(version: str) -> None:
    async def by_path(request: Request, session_id: str, model: str) -> Response:
        return await count_tokens(request, lambda: session_for_path(request, session_id))

    async def by_key(request: Request, model: str) -> Response:
        return await count_tokens(request, lambda: session_for_key(request))

    path = f"/{version}/models/{{model}}:countTokens"
    doc = "Token count of a Gemini request's prompt."
    name = f"gemini_count_tokens_{version}"
    router.add_api_route(
        "/s/{session_id}" + path, by_path, methods=["POST"], name=f"{name}_by_path", description=doc
    )
    router.add_api_route(path, by_key, methods=["POST"], name=f"{name}_by_key", description=doc)


GenerateContent().register(router)
StreamGenerateContent().register(router)
for _version in GenerateContent.versions:
    _count_tokens_routes(_version)
