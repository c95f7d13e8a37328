"""The OpenAI surface: `/v1/chat/completions` and `/v1/models`, per session.

Reachable as `/s/{session_id}/v1/...` (any client that only lets you set a base URL) and as
`/v1/...` with the session's API key as the bearer token. Requests are validated here into
`ChatParams`; everything a turn does lives in `chat.py`. Fields real clients send that rlgw
does not use are ignored; fields it cannot honour are a 400, never a silent change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from rlgw.gateway.chat import ChatParams, run_turn, stream_turn
from rlgw.gateway.errors import APIError, AuthError, ClientDisconnected, InvalidRequest, json_response
from rlgw.gateway.sessions import Session
from rlgw.gateway.tenants import bearer_key

router = APIRouter()
T = TypeVar("T")

ROLES = {"system", "developer", "user", "assistant", "tool"}


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat request, with SGLang's extensions that matter for RL."""

    model_config = ConfigDict(extra="ignore")

    messages: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True


def _check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be one of {sorted(ROLES)}", param=f"messages[{i}].role"
            )
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise InvalidRequest(
                        f"messages[{i}].content: only text parts are supported, got {kind!r}",
                        param=f"messages[{i}].content",
                    )
        elif content is not None and not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string or a list of parts")
        if role == "tool" and not m.get("tool_call_id"):
            raise InvalidRequest(f"messages[{i}]: a tool message needs tool_call_id", param=f"messages[{i}]")
        out.append({**m, "role": "system"} if role == "developer" else m)
    return out


def _check_tools(req: ChatCompletionRequest) -> None:
    names = set()
    for i, t in enumerate(req.tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type", "function") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            raise InvalidRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        names.add(fn["name"])
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or a named function")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    if choice not in (None, "none", "auto") and not req.tools:
        raise InvalidRequest(f"tool_choice={choice!r} needs tools", param="tool_choice")


def chat_params(req: ChatCompletionRequest) -> ChatParams:
    """Validate a chat request into the parameters of one turn."""
    if req.n != 1:
        raise InvalidRequest(
            "n > 1 is not supported: every sample needs its own ledger; open one session per "
            "sample (same rollout, distinct group_index)",
            param="n",
        )
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise InvalidRequest(
            "response_format other than text needs constrained decoding, which rlgw does not do"
        )
    if req.top_logprobs and not req.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs=true", param="top_logprobs")
    _check_tools(req)
    sampling: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "stop"):
        value = getattr(req, name)
        if value is not None:
            sampling[name] = value
    if req.seed is not None:
        sampling["sampling_seed"] = req.seed
    return ChatParams(
        messages=_check_messages(req.messages),
        tools=req.tools or None,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        sampling=sampling,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs or 0,
        stream=req.stream,
        include_usage=bool((req.stream_options or {}).get("include_usage")),
        template_kwargs=dict(req.chat_template_kwargs or {}),
        separate_reasoning=req.separate_reasoning,
    )


def session_for_path(request: Request, session_id: str) -> Session:
    """The open session named in the path; the caller must hold its key or its tenant's key.

    On a gateway with no tenant keys (the one-machine default) the unguessable session id in
    the path is the credential, so agents that send a placeholder key still work.
    """
    state = request.app.state
    session = state.sessions.get_open(session_id)
    if len(state.tenant_keys) == 0:
        return session
    key = bearer_key(request)
    if key and (state.sessions.check_key(session, key) or state.tenant_keys.owner(key) == session.tenant):
        return session
    raise AuthError("this session needs its API key (or its tenant's key) as the bearer token")


def session_for_key(request: Request) -> Session:
    """The session whose API key is the bearer token."""
    key = bearer_key(request)
    session = request.app.state.sessions.by_key(key) if key else None
    if session is None:
        raise AuthError("use a session's API key (POST /v1/sessions), or the base URL /s/{session_id}/v1")
    return request.app.state.sessions.get_open(session.id)


async def parse_body(request: Request) -> dict[str, Any]:
    """The JSON object body of a request (400 if it is not one)."""
    try:
        doc = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    return doc


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def sse_stream(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE events for `first` and the rest; an error after the first byte travels in-stream."""
    yield _sse(first)
    try:
        async for chunk in rest:
            yield _sse(chunk)
    except APIError as exc:
        # After the first byte the status line is gone: errors travel in-stream.
        yield _sse(exc.body())
    yield b"data: [DONE]\n\n"


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first.

    Starlette lets a non-streamed handler run on after its client is gone; here that would
    keep the engine generating for nobody. Cancelling the turn aborts its engine request and
    leaves the ledger untouched.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnected("the client disconnected before the reply was ready")
    return task.result()


async def chat_completions(request: Request, session: Session) -> Response:
    """Serve one chat turn for `session` (streamed or not)."""
    state = request.app.state
    session.last_active = time.monotonic()
    params = chat_params(ChatCompletionRequest.model_validate(await parse_body(request)))
    if not params.stream:
        doc = await cancel_on_disconnect(request, run_turn(state.backend, state.profile, session, params))
        return json_response(200, doc)
    chunks = await stream_turn(state.backend, state.profile, session, params)
    # Enter the generator now: from here on it owns the session lock and releases it in any case.
    first = await chunks.__anext__()
    return StreamingResponse(
        sse_stream(first, chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def models_list(request: Request) -> Response:
    """`GET /v1/models`: the one model this gateway serves."""
    profile = request.app.state.profile
    doc = {
        "object": "list",
        "data": [{"id": profile.name, "object": "model", "created": 0, "owned_by": "rlgw"}],
    }
    return json_response(200, doc)


@router.post("/s/{session_id}/v1/chat/completions")
async def chat_by_path(request: Request, session_id: str) -> Response:
    """Chat completions for the session named in the path."""
    return await chat_completions(request, session_for_path(request, session_id))


@router.post("/v1/chat/completions")
async def chat_by_key(request: Request) -> Response:
    """Chat completions for the session whose key is the bearer token."""
    return await chat_completions(request, session_for_key(request))


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
