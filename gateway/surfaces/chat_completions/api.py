"""The Chat Completions surface: `/v1/chat/completions` and `/v1/models`, per session.

Reachable as `/s/{session_id}/v1/...` (any client that only lets you set a base URL) and as
`/v1/...` with the session's API key as the bearer token. OpenAI's chat shapes are served as
they are (`surfaces/openai_chat.py`); this module fills in the serving flow's hooks with them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from rlgw.gateway.errors import AuthError
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.serving.flow import Surface
from rlgw.gateway.serving.routing import EVENT_HEADER, session_for_path
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.openai_chat import ChatCompletionRequest, chat_params, run_turn, stream_turn
from rlgw.gateway.tenancy.tenants import bearer_key
from rlgw.gateway.turns.messages import ChatParams

router = APIRouter()


class ChatCompletions(Surface[ChatParams]):
    """OpenAI Chat Completions: the chat shapes as they are."""

    path = "/chat/completions"
    name = "chat_completions"
    summary = "Serve one chat turn for `session` (streamed or not)."

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> ChatParams:
        """The request validated into the chat turn's parameters."""
        req = ChatCompletionRequest.model_validate(body)
        return chat_params(req, event=request.headers.get(EVENT_HEADER))

    async def run(self, request: Request, session: Session, call: ChatParams) -> dict[str, Any]:
        """The ChatCompletion."""
        state = request.app.state
        return await run_turn(state.backend, state.profile, session, call)

    def stream(self, request: Request, session: Session, call: ChatParams) -> AsyncIterator[dict[str, Any]]:
        """The ChatCompletionChunks."""
        state = request.app.state
        return stream_turn(state.backend, state.profile, session, call)


def models_list(request: Request) -> Response:
    """`GET /v1/models`: the one model this gateway serves."""
    profile = request.app.state.profile
    doc = {
        "object": "list",
        "data": [{"id": profile.name, "object": "model", "created": 0, "owned_by": "rlgw"}],
    }
    return json_response(200, doc)


@router.get("/s/{session_id}/v1/models")
async def models_by_path(request: Request, session_id: str) -> Response:
    """The served model, for a session's base URL."""
    session_for_path(request, session_id)
    return models_list(request)


@router.get("/v1/models")
async def models_by_key(request: Request) -> Response:
    """The served model, for a session key or a tenant key."""
    key = bearer_key(request)
    state = request.app.state
    if len(state.tenant_keys) and not (key and (state.sessions.by_key(key) or state.tenant_keys.owner(key))):
        raise AuthError("a session or tenant API key is required")
    return models_list(request)


ChatCompletions().register(router)
