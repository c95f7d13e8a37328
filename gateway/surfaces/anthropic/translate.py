"""Anthropic Messages <-> the internal chat turn: requests, replies and stream events.

A Messages request becomes an OpenAI-style chat request body (messages, tools, sampling) that
`/v1/chat/completions` validates the same way, so both surfaces render, match and record one
ledger alike. A ChatCompletion becomes a Messages reply; ChatCompletionChunks become Anthropic's
event sequence. Tool-use ids are the ids the gateway minted, so an echoed `tool_use` block keeps
its sampled tokens; `thinking` blocks carry the sampled reasoning.

Mapping choices (the template has no slot for them, so they are documented, not invented):
- system blocks and multi-block texts are joined with "\\n" (as the renderer joins text parts);
- `tool_result.is_error` is accepted: the template has no error flag, the result text is what the
  model sees (agents put the error in it);
- `thinking` sets the template's reasoning switch (`enable_thinking`); absent, the template's (or
  the gateway's) default stands; `budget_tokens` is not enforced (the template has no budget);
- `cache_control`, `citations`, `metadata` and thinking `signature`s are accepted and ignored.

This module knows nothing about HTTP, sessions or the engine.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.errors import InvalidRequest

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
            if not isinstance(block.get("tool_use_id"), str):
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
        else:
            raise InvalidRequest(f"messages[{i}].role must be 'user' or 'assistant'", param="messages")
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
        if t.get("type") not in (None, "custom") or not isinstance(t.get("name"), str):
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


def chat_request(req: MessagesInput) -> dict[str, Any]:
    """The Chat Completions body equivalent to an Anthropic request (validated again there)."""
    body: dict[str, Any] = {
        "messages": chat_messages(req.system, req.messages),
        "chat_template_kwargs": _template_kwargs(req),
    }
    if req.tools:
        body["tools"] = chat_tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
        body["parallel_tool_calls"] = not req.tool_choice.get("disable_parallel_tool_use", False)
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        body["stream"] = req.stream
        # The usage chunk carries the input and output token counts for `message_delta`.
        body["stream_options"] = {"include_usage": True}
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(req, name)) is not None:
                body[name] = value
        if req.stop_sequences:
            body["stop"] = req.stop_sequences
    return body


def message_id(chat_id: str) -> str:
    """The Messages id of a turn: the ChatCompletion id the ledger recorded, re-prefixed."""
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def stop_reason(finish_reason: str | None, matched_stop: Any) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for OpenAI's finish_reason and SGLang's matched_stop."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched_stop, str) and matched_stop:
        return "stop_sequence", matched_stop
    return "end_turn", None


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    # Anthropic counts cache reads apart: input_tokens is the uncached rest of the prompt.
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "output_tokens": usage["completion_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _tool_input(arguments: str) -> Any:
    # The output parser re-serializes every call's arguments with json.dumps: they parse.
    return json.loads(arguments) if arguments else {}


def message(completion: dict[str, Any]) -> dict[str, Any]:
    """The Messages reply for a ChatCompletion."""
    choice = completion["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": _tool_input(fn["arguments"])}
        )
    reason, sequence = stop_reason(choice["finish_reason"], choice.get("matched_stop"))
    return {
        "id": message_id(completion["id"]),
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(completion["usage"]),
    }


class MessageStream:
    """ChatCompletionChunk dicts -> Anthropic stream events, one content block at a time.

    Reasoning opens a `thinking` block, content a `text` block, each tool call a `tool_use`
    block (its id is the minted call id) whose arguments arrive as `input_json_delta`. A block
    closes when a different kind starts or the turn finishes; the usage chunk (the turn asks
    for one) becomes `message_delta` and `message_stop`.
    """

    def __init__(self) -> None:
        self._started = False
        self._index = -1
        self._open: str | None = None
        self._stop: tuple[str, str | None] = ("end_turn", None)

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events for one chunk (the first chunk opens the message)."""
        if not chunk.get("choices"):
            return self._finish(chunk.get("usage") or {})
        events = [] if self._started else [self._start(chunk)]
        self._started = True
        return events + self._deltas(chunk["choices"][0])

    @staticmethod
    def _start(chunk: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                "id": message_id(chunk["id"]),
                "type": "message",
                "role": "assistant",
                "model": chunk["model"],
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                # The prompt length arrives with the usage chunk, in message_delta.
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        }

    def _deltas(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            if self._open != "thinking":
                events += self._begin({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            if self._open != "text":
                events += self._begin({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id"):
                events += self._begin(
                    {"type": "tool_use", "id": call["id"], "name": fn.get("name"), "input": {}}
                )
            if fn.get("arguments"):
                events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        if choice.get("finish_reason"):
            events += self._close()
            self._stop = stop_reason(choice["finish_reason"], choice.get("matched_stop"))
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

    def _finish(self, usage: dict[str, Any]) -> list[dict[str, Any]]:
        reason, sequence = self._stop
        return [
            *self._close(),
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": _usage(usage),
            },
            {"type": "message_stop"},
        ]
