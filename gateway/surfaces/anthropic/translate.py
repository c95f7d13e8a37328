"""Anthropic Messages <-> the internal chat turn: requests, replies and stream events.

A Messages request is translated straight into the chat turn's parameters (`ChatParams`, with
OpenAI-style messages and function tools, the turn's internal form), so this surface and
`/v1/chat/completions` render, match and record one ledger alike; the request is validated once,
as `MessagesRequest`, and the checks every message turn needs are `message_turn.py`'s. A finished
`ChatTurn` becomes a Messages reply; a streamed turn's items (`ChatStart`, `ChatDelta`s, the
`ChatTurn`) become Anthropic's event sequence. Tool-use ids are the ids the gateway minted, so an
echoed `tool_use` block keeps its sampled tokens; `thinking` blocks carry the sampled reasoning.

Mapping choices (the template has no slot for them, so they are documented, not invented):
- system blocks and multi-block texts are joined with "\\n" (as the renderer joins text parts);
- `tool_result.is_error` is accepted: the template has no error flag, the result text is what the
  model sees (agents put the error in it);
- `thinking` sets the template's reasoning switch (`enable_thinking`); absent, the template's (or
  the gateway's) default stands; `budget_tokens` is not enforced (the template has no budget);
- a `{"role": "system"}` message inside `messages` (Claude Code's mid-conversation system
  turns) is a system chat message at its place; `output_config` and `clear_at` on it, and one
  with no text, add nothing to the prompt. Whether the served template can place it there is
  the surface's business (`mid_system.py`);
- `cache_control`, `citations`, `metadata`, `output_config`, `context_management` and thinking
  `signature`s are accepted and ignored (`thinking.type` "adaptive" turns reasoning on).

This module knows nothing about HTTP, sessions or the engine.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.message_turn import call_arguments, checked
from rlgw.gateway.turns.messages import ChatDelta, ChatParams, ChatStart, ChatTurn

# Anthropic's tool_choice types -> OpenAI's (the named form is built per request).
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_THINKING = {"enabled": True, "adaptive": True, "disabled": False}


class MessagesInput(BaseModel):
    """What both `/v1/messages` and `/v1/messages/count_tokens` take: the conversation and tools."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    # SGLang's extension, as on /v1/chat/completions: wins over what `thinking` sets.
    chat_template_kwargs: dict[str, Any] | None = None


class MessagesRequest(MessagesInput):
    """Anthropic's `POST /v1/messages` body (unknown fields are accepted and ignored)."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool = False


def _text(content: Any, where: str) -> str:
    """The text of a string or a list of text blocks (other block kinds are a 400)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of text blocks", param=where)
    texts = []
    for j, block in enumerate(content):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequest(
                f"{where}[{j}]: only text blocks are supported here, got {kind!r}", param=where
            )
        texts.append(block["text"])
    return "\n".join(texts)


def _user(content: Any, i: int) -> list[dict[str, Any]]:
    """A user turn: its text, and each `tool_result` as a tool message, in block order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or a list of blocks", param="messages")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text([block], f"messages[{i}].content"))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise InvalidRequest(
                    f"messages[{i}].content[{j}]: a tool_result needs tool_use_id", param="messages"
                )
            result = _text(block.get("content") or "", f"messages[{i}].content[{j}].content")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            raise InvalidRequest(
                f"messages[{i}].content[{j}]: {kind!r} blocks are not supported in a user turn "
                "(text and tool_result are)",
                param="messages",
            )
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, i: int) -> dict[str, Any]:
    """An assistant turn: text -> content, thinking -> reasoning_content, tool_use -> tool_calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or a list of blocks", param="messages")
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text([block], f"messages[{i}].content"))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic: nothing a local template could render
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise InvalidRequest(
                    f"messages[{i}].content[{j}]: a tool_use needs id and name", param="messages"
                )
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": arguments},
                }
            )
        else:
            raise InvalidRequest(
                f"messages[{i}].content[{j}]: {kind!r} blocks are not supported in an assistant turn",
                param="messages",
            )
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thinking:
        msg["reasoning_content"] = "\n".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system_turn(content: Any, i: int) -> str:
    """The text of a mid-conversation system message ("" for none: Claude Code sends empty ones
    that only carry `output_config`). Blocks other than text (tool additions) cannot be served:
    the error code is the one Claude Code falls back on."""
    if isinstance(content, list):
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            if kind != "text":
                raise InvalidRequest(
                    f"messages[{i}].content[{j}]: {kind!r} blocks are not supported in a system message "
                    "(text is)",
                    param="messages",
                    code="mid_conversation_tool_changes_not_supported",
                )
    return _text(content if content is not None else "", f"messages[{i}].content")


def chat_messages(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """OpenAI-style chat messages for an Anthropic system prompt and message list."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out.extend(_user(m.get("content"), i))
        elif role == "assistant":
            out.append(_assistant(m.get("content"), i))
        elif role == "system":
            if text := _system_turn(m.get("content"), i):
                out.append({"role": "system", "content": text})
        else:
            raise InvalidRequest(
                f"messages[{i}].role must be 'user', 'assistant' or 'system'", param="messages"
            )
    if messages[-1].get("role") == "assistant":
        raise InvalidRequest(
            "a final assistant message (prefill) is not supported: every turn starts a new assistant message",
            param="messages",
        )
    return out


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools for Anthropic client tools (`name`, `description`, `input_schema`)."""
    out = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom") or not isinstance(t.get("name"), str) or not t["name"]:
            raise InvalidRequest(
                f"tools[{i}]: only client tools ({{name, description, input_schema}}) are supported, "
                f"not {t.get('type')!r}",
                param="tools",
            )
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description"):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind not in _TOOL_CHOICE:
        raise InvalidRequest("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice")
    return _TOOL_CHOICE[kind]


def _template_kwargs(req: MessagesInput) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if req.thinking is not None:
        kind = req.thinking.get("type")
        if kind not in _THINKING:
            raise InvalidRequest(
                "thinking.type must be 'enabled', 'adaptive' or 'disabled'", param="thinking"
            )
        kw["enable_thinking"] = _THINKING[kind]
    kw.update(req.chat_template_kwargs or {})
    return kw


def turn_params(req: MessagesInput, event: str | None = None) -> ChatParams:
    """The chat turn's parameters for an Anthropic request (400s for what the turn cannot take).

    A `MessagesInput` alone (`count_tokens`) has no sampling: its parameters only render."""
    choice = req.tool_choice
    params = ChatParams(
        messages=chat_messages(req.system, req.messages),
        template_kwargs=_template_kwargs(req),
        tools=chat_tools(req.tools) if req.tools else None,
        tool_choice=_tool_choice(choice) if choice is not None else None,
        parallel_tool_calls=not (choice or {}).get("disable_parallel_tool_use", False),
        sampling={},
        max_tokens=None,
        logprobs=False,
        top_logprobs=0,
        stream=False,
        include_usage=False,
        surface="messages",
        event=event,
    )
    if isinstance(req, MessagesRequest):
        params.max_tokens, params.stream = req.max_tokens, req.stream
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(req, name)) is not None:
                params.sampling[name] = value
        if req.stop_sequences:
            params.sampling["stop"] = req.stop_sequences
    return checked(params)


def message_id(response_id: str) -> str:
    """The Messages id of a turn: the response id the ledger recorded, re-prefixed."""
    return "msg_" + response_id.removeprefix("chatcmpl-")


def stop_reason(finish_reason: str | None, matched_stop: Any) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for the turn's finish_reason and SGLang's matched_stop."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched_stop, str) and matched_stop:
        return "stop_sequence", matched_stop
    return "end_turn", None


def _usage(turn: ChatTurn) -> dict[str, Any]:
    cached = turn.result.cached_tokens
    # Anthropic counts cache reads apart: input_tokens is the uncached rest of the prompt.
    return {
        "input_tokens": turn.prompt_tokens - cached,
        "output_tokens": len(turn.result.output_ids),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _tool_input(arguments: str) -> Any:
    # A call streamed as sampled keeps the model's arguments text, which may not parse (the
    # sample's metadata flags it): `input` must be an object, so such a call gets an empty one.
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message(turn: ChatTurn, model: str) -> dict[str, Any]:
    """The Messages reply for a finished turn of `model`."""
    parsed = turn.parsed
    content: list[dict[str, Any]] = []
    if parsed.reasoning_content:
        content.append({"type": "thinking", "thinking": parsed.reasoning_content, "signature": ""})
    if parsed.content:
        content.append({"type": "text", "text": parsed.content})
    for call, cid in zip(parsed.tool_calls, turn.call_ids, strict=True):
        tool_input = _tool_input(call.arguments)
        content.append({"type": "tool_use", "id": cid, "name": call.name, "input": tool_input})
    reason, sequence = stop_reason(turn.finish_reason, turn.matched_stop)
    return {
        "id": message_id(turn.response_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(turn),
    }


class MessageStream:
    """A streamed turn's items -> Anthropic stream events, one content block at a time.

    `ChatStart` opens the message. Reasoning opens a `thinking` block, content a `text` block,
    each tool call a `tool_use` block (its id is the minted call id) whose arguments arrive as
    `input_json_delta`. A block closes when a different kind starts or the turn finishes; the
    finished `ChatTurn` becomes `message_delta` (stop reason, usage) and `message_stop`.
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._index = -1
        self._open: str | None = None

    def feed(self, item: ChatStart | ChatDelta | ChatTurn) -> list[dict[str, Any]]:
        """The events for one item of the turn."""
        if isinstance(item, ChatStart):
            return [self._start(item)]
        if isinstance(item, ChatDelta):
            return self._deltas(item)
        return self._finish(item)

    def _start(self, start: ChatStart) -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                "id": message_id(start.response_id),
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                # The prompt length arrives with the finished turn, in message_delta.
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        }

    def _deltas(self, d: ChatDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if d.kind == "reasoning":
            if self._open != "thinking":
                events += self._begin({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": d.text}))
        elif d.kind == "content":
            if self._open != "text":
                events += self._begin({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": d.text}))
        else:
            assert d.call is not None
            if d.kind != "tool_call_args":  # a call starts (whole, or its arguments follow)
                block = {"type": "tool_use", "id": d.call_id, "name": d.call.name, "input": {}}
                events += self._begin(block)
            arguments = call_arguments(d)
            if arguments:
                events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _begin(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        return [*events, {"type": "content_block_start", "index": self._index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _finish(self, turn: ChatTurn) -> list[dict[str, Any]]:
        reason, sequence = stop_reason(turn.finish_reason, turn.matched_stop)
        return [
            *self._close(),
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": _usage(turn),
            },
            {"type": "message_stop"},
        ]
