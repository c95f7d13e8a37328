"""OpenAI's chat shapes over the message turn: the request validated into `ChatParams`, and the
ChatCompletion and its chunks built from what the turn returns or yields.

Chat Completions serves these shapes as they are (`chat_completions/`). Anthropic Messages and
OpenAI Responses do not pass through them: each translates its own request and replies
(`message_turn.py` holds the checks all three share). The turn itself is `turns/messages.py`'s.
Fields real clients send that rlgw does not use are ignored; fields it cannot honour are a 400,
never a silent change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.engine_client.backend import ModelBackend
from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.model.render import check_template_kwargs
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.surfaces.message_turn import check_tool_choice
from rlgw.gateway.turns.messages import (
    ChatDelta,
    ChatParams,
    ChatStart,
    ChatTurn,
    TokenLogprob,
    run_chat,
    stream_chat,
)

ROLES = {"system", "developer", "user", "assistant", "tool"}


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat request, with SGLang's extensions that matter for RL."""

    model_config = ConfigDict(extra="ignore")

    # Each message is checked by `_check_messages`: validating them as dicts here would copy
    # every one (about 30 us per turn at a 32k-token history).
    messages: list[Any] = Field(min_length=1)
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
    ignore_eos: bool | None = None  # SGLang's and vLLM's extension: generate past the stop token
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
    # SGLang's constrained-decoding extensions, forwarded as its sampling parameters.
    regex: str | None = None
    ebnf: str | None = None


def _check_messages(messages: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
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
    for i, t in enumerate(req.tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type", "function") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            raise InvalidRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
    check_tool_choice(req.tools, req.tool_choice)


def _constraints(req: ChatCompletionRequest) -> dict[str, Any]:
    """SGLang's constrained-decoding sampling params for `response_format` (and its extensions)."""
    out: dict[str, Any] = {}
    fmt = req.response_format
    kind = fmt.get("type") if fmt else None
    if kind == "json_object":
        out["json_schema"] = '{"type": "object"}'
    elif kind == "json_schema":
        spec = fmt.get("json_schema") if fmt else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format json_schema needs json_schema.schema (an object)", param="response_format"
            )
        out["json_schema"] = orjson.dumps(schema).decode()
    elif kind not in (None, "text"):
        raise InvalidRequest(
            f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
            param="response_format",
        )
    for name in ("regex", "ebnf"):
        if getattr(req, name) is not None:
            out[name] = getattr(req, name)
    if len(out) > 1:
        raise InvalidRequest("use one of response_format, regex and ebnf", param="response_format")
    return out


def chat_params(req: ChatCompletionRequest, *, event: str | None = None) -> ChatParams:
    """Validate a chat request into the parameters of one turn."""
    if req.n != 1:
        raise InvalidRequest(
            "n > 1 is not supported: every sample needs its own ledger; open one session per "
            "sample (same rollout, distinct group_index)",
            param="n",
        )
    if req.top_logprobs and not req.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs=true", param="top_logprobs")
    _check_tools(req)
    kwargs = dict(req.chat_template_kwargs or {})
    check_template_kwargs(kwargs)
    sampling: dict[str, Any] = _constraints(req)
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "stop"):
        value = getattr(req, name)
        if value is not None:
            sampling[name] = value
    if req.seed is not None:
        sampling["sampling_seed"] = req.seed
    if req.ignore_eos is not None:
        sampling["ignore_eos"] = req.ignore_eos
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
        template_kwargs=kwargs,
        separate_reasoning=req.separate_reasoning,
        event=event,
    )


def _logprobs_doc(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if entries is None:
        return None

    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries
        ]
    }


def _usage(turn: ChatTurn) -> dict[str, Any]:
    n_in, n_out = turn.prompt_tokens, len(turn.result.output_ids)
    return {
        "prompt_tokens": n_in,
        "completion_tokens": n_out,
        "total_tokens": n_in + n_out,
        "prompt_tokens_details": {"cached_tokens": turn.result.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": turn.reasoning_tokens},
    }


def completion_doc(profile: ModelProfile, turn: ChatTurn) -> dict[str, Any]:
    """OpenAI's ChatCompletion object for a finished turn."""
    parsed = turn.parsed
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "reasoning_content": parsed.reasoning_content,
    }
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {
                "id": cid,
                "index": c.index,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c, cid in zip(parsed.tool_calls, turn.call_ids, strict=True)
        ]
    choice = {
        "index": 0,
        "message": msg,
        "finish_reason": turn.finish_reason,
        "matched_stop": turn.matched_stop,
        "logprobs": _logprobs_doc(turn.logprobs),
    }
    return {
        "id": turn.response_id,
        "object": "chat.completion",
        "created": turn.created,
        "model": profile.name,
        "choices": [choice],
        "usage": _usage(turn),
        "metadata": {"weight_version": turn.result.weight_version},
    }


def _chunk(rid: str, created: int, model: str, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def _delta_chunks(rid: str, created: int, model: str, d: ChatDelta) -> list[dict[str, Any]]:
    """OpenAI chunks for one delta (a tool call: its name chunk, then its arguments)."""
    lp = {"logprobs": _logprobs_doc(d.logprobs)} if d.logprobs else {}
    if d.kind == "content":
        return [_chunk(rid, created, model, {"content": d.text}, **lp)]
    if d.kind == "reasoning":
        return [_chunk(rid, created, model, {"reasoning_content": d.text}, **lp)]
    assert d.call is not None
    if d.kind == "tool_call_args":
        return [_chunk(rid, created, model, {"tool_calls": [_args(d.call.index, d.text)]}, **lp)]
    head = {"id": d.call_id, "index": d.call.index, "type": "function"}
    start = _chunk(
        rid,
        created,
        model,
        {"tool_calls": [{**head, "function": {"name": d.call.name, "arguments": ""}}]},
        **lp,
    )
    if d.kind == "tool_call_start":  # its arguments follow as they are sampled
        return [start]
    return [start, _chunk(rid, created, model, {"tool_calls": [_args(d.call.index, d.call.arguments)]})]


def _args(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "id": None, "type": "function", "function": {"arguments": text}}


async def run_turn(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> dict[str, Any]:
    """A non-streamed chat turn as OpenAI's ChatCompletion object."""
    return completion_doc(profile, await run_chat(backend, profile, session, params))


async def stream_turn(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat turn as OpenAI's ChatCompletionChunk objects.

    Awaiting the first chunk raises the errors that have an HTTP status; after it, the turn
    holds the session until the iterator is exhausted or closed.
    """
    rid, created, model = "", 0, profile.name
    async for item in stream_chat(backend, profile, session, params):
        if isinstance(item, ChatStart):
            rid, created = item.response_id, item.created
            yield _chunk(rid, created, model, {"role": "assistant", "content": ""})
        elif isinstance(item, ChatDelta):
            for chunk in _delta_chunks(rid, created, model, item):
                yield chunk
        else:
            final = {"finish_reason": item.finish_reason, "matched_stop": item.matched_stop}
            if item.logprobs:
                final["logprobs"] = _logprobs_doc(item.logprobs)
            yield _chunk(rid, created, model, {}, **final)
            if params.include_usage:
                yield {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(item),
                }
