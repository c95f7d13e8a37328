"""OpenAI Responses <-> the internal chat turn: input items, response objects and stream events.

Input items become OpenAI chat messages: a run of consecutive assistant-side items (`reasoning`,
assistant `message`, `function_call`) is one assistant message, so an echoed turn matches the
ledger's turn by its `call_id`s (the ids the gateway minted) or its text; `function_call_output`
items are tool messages. The ChatCompletion of a turn becomes the Response's output items
(reasoning, message, function calls), and ChatCompletionChunks become Responses stream events.

Mapping choices: `instructions` is a system message in front of the conversation (per OpenAI,
it is not carried over by `previous_response_id`); `reasoning.effort` "none" turns the
template's reasoning switch off, any other effort turns it on; `usage.output_tokens_details`
does not count reasoning tokens apart (0).

This module knows nothing about HTTP, sessions or the engine.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.errors import InvalidRequest

_ASSISTANT_ITEMS = frozenset({"reasoning", "function_call"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_INPUT_ROLES = {"user": "user", "system": "system", "developer": "system"}


class ResponsesRequest(BaseModel):
    """OpenAI's `POST /v1/responses` body (unknown fields are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    # SGLang's extensions, as on /v1/chat/completions.
    top_k: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return value


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of content parts", param="input")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(f"{where}[{j}]: only text parts are supported, got {kind!r}", param="input")
        texts.append(str(part.get("text") or ""))
    return "\n".join(texts)


class _AssistantTurn:
    """Consecutive assistant-side items, gathered into one chat message."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def add(self, item: dict[str, Any], kind: str, where: str) -> None:
        if kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            self.reasoning.append("\n".join(str(p.get("text") or "") for p in parts if isinstance(p, dict)))
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise InvalidRequest(f"{where}: a function_call needs call_id and name", param="input")
            fn = {"name": item["name"], "arguments": item.get("arguments") or "{}"}
            self.calls.append({"id": item["call_id"], "type": "function", "function": fn})
        else:
            self.texts.append(_text(item.get("content"), f"{where}.content"))

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(self.texts)}
        if any(self.reasoning):
            msg["reasoning_content"] = "\n".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = self.calls
        return msg


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style chat messages for `instructions` and a list of input items."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    turn: _AssistantTurn | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind in _ASSISTANT_ITEMS or (kind == "message" and item.get("role") == "assistant"):
            turn = turn or _AssistantTurn()
            turn.add(item, kind, where)
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        if kind == "message" and item.get("role") in _INPUT_ROLES:
            role = _INPUT_ROLES[item["role"]]
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequest(f"{where}: a function_call_output needs call_id", param="input")
            content = _text(item.get("output") or "", f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        else:
            raise InvalidRequest(
                f"{where}: {kind!r} items are not supported (message, reasoning, function_call, "
                "function_call_output are)",
                param="input",
            )
    if turn is not None:
        raise InvalidRequest(
            "the input ends with an assistant item: there is nothing to answer", param="input"
        )
    return out


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat function tools for Responses function tools."""
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise InvalidRequest(
                f"tools[{i}]: only function tools are supported, not {t.get('type')!r}", param="tools"
            )
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description"):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise InvalidRequest("tool_choice: only function tools can be named", param="tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _template_kwargs(req: ResponsesRequest) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        kw["enable_thinking"] = effort != "none"
    kw.update(req.chat_template_kwargs or {})
    return kw


def chat_request(req: ResponsesRequest, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chat Completions body for a Responses request over the whole item list `items`."""
    fmt = ((req.text or {}).get("format") or {}).get("type")
    if fmt not in (None, "text"):
        raise InvalidRequest("text.format other than text needs constrained decoding, which rlgw does not do")
    body: dict[str, Any] = {
        "messages": chat_messages(req.instructions, items),
        "parallel_tool_calls": req.parallel_tool_calls,
        "stream": req.stream,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": _template_kwargs(req),
    }
    if req.tools:
        body["tools"] = chat_tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    for name in ("temperature", "top_p", "top_k"):
        if (value := getattr(req, name)) is not None:
            body[name] = value
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    return body


def response_id(chat_id: str) -> str:
    """The Response id of a turn: the ChatCompletion id the ledger recorded, re-prefixed."""
    return "resp_" + chat_id.removeprefix("chatcmpl-")


def _item_id(prefix: str, rid: str, k: int) -> str:
    return f"{prefix}_{rid.removeprefix('resp_')}_{k}"


def reasoning_item(rid: str, k: int, text: str) -> dict[str, Any]:
    """A finished `reasoning` output item (the sampled reasoning as `reasoning_text`)."""
    return {
        "type": "reasoning",
        "id": _item_id("rs", rid, k),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def message_item(rid: str, k: int, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant `message` output item with one `output_text` part."""
    return {
        "type": "message",
        "id": _item_id("msg", rid, k),
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(rid: str, k: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A `function_call` output item; `call_id` is the id the gateway minted."""
    return {
        "type": "function_call",
        "id": _item_id("fc", rid, k),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def output_items(rid: str, msg: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items of an assistant chat message: reasoning, message, then function calls.

    A turn with no tool call always gets a message item (even empty), so that echoing the
    output back always carries the assistant turn the ledger holds.
    """
    items: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        items.append(reasoning_item(rid, len(items), msg["reasoning_content"]))
    calls = msg.get("tool_calls") or []
    if msg.get("content") or not calls:
        items.append(message_item(rid, len(items), msg.get("content") or ""))
    for call in calls:
        fn = call["function"]
        items.append(function_call_item(rid, len(items), call["id"], fn["name"], fn["arguments"]))
    return items


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Responses usage for Chat Completions usage."""
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        # The engine's prefix cache has no separate write count.
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def response_shell(
    req: ResponsesRequest, rid: str, model: str, created_at: float | None = None
) -> dict[str, Any]:
    """A Response object echoing the request, with no output yet (status in_progress)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created_at if created_at is not None else time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning or {"effort": None, "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": req.metadata or {},
    }


def finish(shell: dict[str, Any], output: list[dict[str, Any]], finish_reason: str, chat_usage: dict) -> dict:
    """The finished Response: its output, usage and status (a turn cut by length is incomplete)."""
    cut = finish_reason == "length"
    return {
        **shell,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": usage(chat_usage),
    }


def response(req: ResponsesRequest, completion: dict[str, Any]) -> dict[str, Any]:
    """The Response object for a non-streamed turn's ChatCompletion."""
    rid = response_id(completion["id"])
    choice = completion["choices"][0]
    shell = response_shell(req, rid, completion["model"], completion["created"])
    return finish(shell, output_items(rid, choice["message"]), choice["finish_reason"], completion["usage"])


class ResponseStream:
    """ChatCompletionChunk dicts -> Responses stream events, one output item at a time.

    Reasoning opens a `reasoning` item, content a `message` item, each tool call a
    `function_call` item (its call_id is the minted id). An item is done when another kind
    starts or the turn finishes; the usage chunk (the turn asks for one) ends the stream with
    `response.completed` (or `response.incomplete`). `output` holds the finished items.
    """

    def __init__(self, req: ResponsesRequest) -> None:
        self._req = req
        self._seq = 0
        self._shell: dict[str, Any] | None = None
        self._open: dict[str, Any] | None = None
        self._finish_reason = "stop"
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] | None = None  # the finished Response, after the last chunk

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events for one chunk (the first chunk opens the response)."""
        events: list[dict[str, Any]] = []
        if self._shell is None:
            self._shell = response_shell(
                self._req, response_id(chunk["id"]), chunk["model"], chunk["created"]
            )
            events += [self._event("response.created", response=self._shell)]
            events += [self._event("response.in_progress", response=self._shell)]
        if not chunk.get("choices"):
            return events + self._complete(chunk.get("usage") or {})
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        if text := delta.get("reasoning_content"):
            events += self._text_delta("reasoning", text)
        if text := delta.get("content"):
            events += self._text_delta("message", text)
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id"):
                events += self._close()
                item = function_call_item(self._rid, len(self.output), call["id"], fn.get("name") or "", "")
                events += self._begin({**item, "status": "in_progress"})
            if args := fn.get("arguments"):
                assert self._open is not None
                self._open["arguments"] += args
                events.append(self._item_event("response.function_call_arguments.delta", delta=args))
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
            events += self._close()
            if not any(i["type"] in ("message", "function_call") for i in self.output):
                events += self._begin(message_item(self._rid, len(self.output), "", "in_progress"))
                events += self._close()
        return events

    def fail(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that end a stream whose turn failed (OpenAI's error body `error`):
        `error`, then `response.failed` with the items finished so far."""
        code, message = error.get("code") or error.get("type"), error.get("message", "")
        events = [self._event("error", code=code, message=message, param=error.get("param"))]
        if self._shell is not None:
            # A Response's error code is one of OpenAI's enum; the gateway's own code is in `error`.
            failed = {
                **self._shell,
                "status": "failed",
                "error": {"code": "server_error", "message": message},
            }
            events.append(self._event("response.failed", response={**failed, "output": self.output}))
        return events

    @property
    def _rid(self) -> str:
        assert self._shell is not None
        return self._shell["id"]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def _item_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        assert self._open is not None
        return self._event(kind, item_id=self._open["id"], output_index=len(self.output), **fields)

    def _text_delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()  # first: the new item's index counts the closed one
            k = len(self.output)
            if kind == "reasoning":
                item = {**reasoning_item(self._rid, k, ""), "content": [], "status": "in_progress"}
            else:
                item = {**message_item(self._rid, k, "", "in_progress"), "content": []}
            events += self._begin(item)
        assert self._open is not None
        part = self._open["content"][0]
        part["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self._item_event(name, content_index=0, delta=text, **extra)]

    def _begin(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._open = item
        events.append(
            self._event("response.output_item.added", output_index=len(self.output), item=dict(item))
        )
        if item["type"] == "function_call":
            return events
        part = (
            {"type": "reasoning_text", "text": ""}
            if item["type"] == "reasoning"
            else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        )
        item["content"] = [part]
        events.append(self._item_event("response.content_part.added", content_index=0, part=dict(part)))
        return events

    def _close(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        events: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            events.append(
                self._item_event(
                    "response.function_call_arguments.done", arguments=item["arguments"], name=item["name"]
                )
            )
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                events.append(
                    self._item_event("response.reasoning_text.done", content_index=0, text=part["text"])
                )
            else:
                events.append(
                    self._item_event(
                        "response.output_text.done", content_index=0, text=part["text"], logprobs=[]
                    )
                )
            events.append(self._item_event("response.content_part.done", content_index=0, part=part))
        item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=len(self.output), item=item))
        self.output.append(item)
        self._open = None
        return events

    def _complete(self, chat_usage: dict[str, Any]) -> list[dict[str, Any]]:
        assert self._shell is not None
        self.response = finish(self._shell, self.output, self._finish_reason, chat_usage)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return [self._event(kind, response=self.response)]
