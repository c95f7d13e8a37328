"""OpenAI Responses <-> the internal chat turn: input items, response objects and stream events.

A request, validated once as `ResponsesRequest`, is translated straight into the chat turn's
parameters (`ChatParams`; the checks every message turn needs are `message_turn.py`'s). Input
items become the turn's (OpenAI-style) chat messages: a run of consecutive assistant-side items
(`reasoning`, assistant `message`, `function_call`) is one assistant message, so an echoed turn
matches the ledger's turn by its `call_id`s (the ids the gateway minted) or its text;
`function_call_output` items are tool messages. A finished `ChatTurn` becomes the Response's
output items (reasoning, message, function calls), and a streamed turn's items (`ChatStart`,
`ChatDelta`s, the `ChatTurn`) become Responses stream events.

Mapping choices: `instructions` is a system message in front of the conversation (per OpenAI,
it is not carried over by `previous_response_id`); `reasoning.effort` "none" turns the
template's reasoning switch off, any other effort turns it on; `usage.output_tokens_details`
counts the sampled reasoning tokens (streamed or not).

This module knows nothing about HTTP, sessions or the engine.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.message_turn import call_arguments, checked
from rlgw.gateway.turns.messages import ChatDelta, ChatParams, ChatStart, ChatTurn

_ASSISTANT_ITEMS = frozenset({"reasoning", "function_call"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_INPUT_ROLES = {"user": "user", "system": "system", "developer": "system"}
# Tools OpenAI's servers run themselves: nothing here can execute them, so they are left out.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
        "tool_search",
    }
)


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
            name = qualified(item.get("namespace"), item["name"])
            fn = {"name": name, "arguments": item.get("arguments") or "{}"}
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
            if not isinstance(item.get("call_id"), str) or not item["call_id"]:
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


def qualified(namespace: str | None, name: str) -> str:
    """The name a function of a `namespace` tool has in the template's tool list."""
    return f"{namespace}.{name}" if namespace else name


def namespaced(tools: list[dict[str, Any]] | None) -> dict[str, tuple[str, str]]:
    """Qualified name -> (namespace, name) for every function inside a `namespace` tool."""
    out: dict[str, tuple[str, str]] = {}
    for t in tools or []:
        if t.get("type") == "namespace" and isinstance(t.get("name"), str):
            for inner in t.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    out[qualified(t["name"], inner["name"])] = (t["name"], inner["name"])
    return out


def _function(t: dict[str, Any], name: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if t.get("description"):
        fn["description"] = t["description"]
    fn["parameters"] = t.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def chat_tools(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """OpenAI chat function tools for Responses tools, and the hosted tools left out.

    Function tools pass as they are; the functions of a `namespace` tool (Codex groups its
    sub-agent tools in one) join the list under their qualified name (`namespace.name`), and a
    call to one goes back as a `function_call` naming its namespace. Hosted tools, which the
    model's host would run (`web_search`, `file_search`, ...), are left out, so the model never
    sees a tool no one can execute; tools the client would run in a shape the template cannot
    express (`custom`, `local_shell`, `computer_use_preview`) are a 400.
    """
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, t in enumerate(tools):
        kind = t.get("type")
        if kind in ("function", "namespace") and t.get("name") == "":
            raise InvalidRequest(f"tools[{i}]: a {kind} tool needs a name", param="tools")
        if kind == "function" and isinstance(t.get("name"), str):
            out.append(_function(t, t["name"]))
        elif kind == "namespace" and isinstance(t.get("name"), str):
            for j, inner in enumerate(t.get("tools") or []):
                if not isinstance(inner, dict) or inner.get("type", "function") != "function":
                    got = inner.get("type") if isinstance(inner, dict) else type(inner).__name__
                    raise InvalidRequest(
                        f"tools[{i}].tools[{j}]: a namespace holds function tools only, not {got!r}",
                        param="tools",
                    )
                out.append(_function(inner, qualified(t["name"], inner["name"])))
        elif kind in HOSTED_TOOLS:
            dropped.append(kind)
        else:
            raise InvalidRequest(
                f"tools[{i}]: {kind!r} tools are not supported (function and namespace tools are; hosted "
                f"tools {sorted(HOSTED_TOOLS)} are left out)",
                param="tools",
            )
    return out, dropped


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


def turn_params(req: ResponsesRequest, items: list[dict[str, Any]], event: str | None = None) -> ChatParams:
    """The chat turn's parameters for a Responses request over the whole item list `items`
    (400s for what the turn cannot take); hosted tools left out are noted as `dropped_tools`."""
    fmt = ((req.text or {}).get("format") or {}).get("type")
    if fmt not in (None, "text"):
        raise InvalidRequest("text.format other than text needs constrained decoding, which rlgw does not do")
    messages, template_kwargs = chat_messages(req.instructions, items), _template_kwargs(req)
    tools, dropped = chat_tools(req.tools) if req.tools else ([], [])
    params = ChatParams(
        messages=messages,
        tools=tools or None,
        tool_choice=_tool_choice(req.tool_choice) if req.tool_choice is not None else None,
        parallel_tool_calls=req.parallel_tool_calls,
        sampling={
            name: value
            for name in ("temperature", "top_p", "top_k")
            if (value := getattr(req, name)) is not None
        },
        max_tokens=req.max_output_tokens,
        logprobs=False,
        top_logprobs=0,
        stream=req.stream,
        include_usage=False,
        template_kwargs=template_kwargs,
        surface="responses",
        event=event,
    )
    if dropped:
        params.notes["dropped_tools"] = dropped
    return checked(params)


def response_id(turn_id: str) -> str:
    """The Response id of a turn: the response id the ledger recorded, re-prefixed."""
    return "resp_" + turn_id.removeprefix("chatcmpl-")


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


def function_call_item(
    rid: str,
    k: int,
    call_id: str,
    name: str,
    arguments: str,
    spaces: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A `function_call` output item; `call_id` is the id the gateway minted. A function of a
    `namespace` tool (`spaces`, from `namespaced`) is named by its namespace and its own name."""
    item = {
        "type": "function_call",
        "id": _item_id("fc", rid, k),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }
    if spaces and name in spaces:
        item["namespace"], item["name"] = spaces[name]
    return item


def output_items(
    rid: str, turn: ChatTurn, spaces: dict[str, tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """The output items of a finished turn: reasoning, message, then function calls.

    A turn with no tool call always gets a message item (even empty), so that echoing the
    output back always carries the assistant turn the ledger holds.
    """
    parsed = turn.parsed
    items: list[dict[str, Any]] = []
    if parsed.reasoning_content:
        items.append(reasoning_item(rid, len(items), parsed.reasoning_content))
    if parsed.content or not parsed.tool_calls:
        items.append(message_item(rid, len(items), parsed.content or ""))
    for call, cid in zip(parsed.tool_calls, turn.call_ids, strict=True):
        items.append(function_call_item(rid, len(items), cid, call.name, call.arguments, spaces))
    return items


def usage(turn: ChatTurn) -> dict[str, Any]:
    """Responses usage for a finished turn."""
    n_in, n_out = turn.prompt_tokens, len(turn.result.output_ids)
    return {
        "input_tokens": n_in,
        # The engine's prefix cache has no separate write count.
        "input_tokens_details": {"cached_tokens": turn.result.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": turn.reasoning_tokens},
        "total_tokens": n_in + n_out,
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


def finish(shell: dict[str, Any], output: list[dict[str, Any]], turn: ChatTurn) -> dict[str, Any]:
    """The finished Response: its output, usage and status (a turn cut by length is incomplete)."""
    cut = turn.finish_reason == "length"
    return {
        **shell,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "usage": usage(turn),
    }


def response(req: ResponsesRequest, turn: ChatTurn, model: str) -> dict[str, Any]:
    """The Response object for a non-streamed turn of `model`."""
    rid = response_id(turn.response_id)
    shell = response_shell(req, rid, model, turn.created)
    return finish(shell, output_items(rid, turn, namespaced(req.tools)), turn)


class ResponseStream:
    """A streamed turn's items -> Responses stream events, one output item at a time.

    `ChatStart` opens the response. Reasoning opens a `reasoning` item, content a `message`
    item, each tool call a `function_call` item (its call_id is the minted id). An item is done
    when another kind starts or the turn finishes; the finished `ChatTurn` ends the stream with
    `response.completed` (or `response.incomplete`). `output` holds the finished items.
    """

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self._req = req
        self._model = model
        self._spaces = namespaced(req.tools)
        self._seq = 0
        self._shell: dict[str, Any] | None = None
        self._open: dict[str, Any] | None = None
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] | None = None  # the finished Response, after the last item

    def feed(self, item: ChatStart | ChatDelta | ChatTurn) -> list[dict[str, Any]]:
        """The events for one item of the turn."""
        if isinstance(item, ChatStart):
            self._shell = response_shell(self._req, response_id(item.response_id), self._model, item.created)
            return [
                self._event("response.created", response=self._shell),
                self._event("response.in_progress", response=self._shell),
            ]
        if isinstance(item, ChatTurn):
            return self._complete(item)
        if item.kind in ("reasoning", "content"):
            return self._text_delta("message" if item.kind == "content" else "reasoning", item.text)
        assert item.call is not None
        events: list[dict[str, Any]] = []
        if item.kind != "tool_call_args":  # a call starts (whole, or its arguments follow)
            events += self._close()  # first: the new item's index counts the closed one
            k, name = len(self.output), item.call.name
            fc = function_call_item(self._rid, k, item.call_id, name, "", self._spaces)
            events += self._begin({**fc, "status": "in_progress"})
        args = call_arguments(item)
        if args:
            assert self._open is not None
            self._open["arguments"] += args
            events.append(self._item_event("response.function_call_arguments.delta", delta=args))
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

    def _complete(self, turn: ChatTurn) -> list[dict[str, Any]]:
        assert self._shell is not None
        events = self._close()
        if not any(i["type"] in ("message", "function_call") for i in self.output):
            events += self._begin(message_item(self._rid, len(self.output), "", "in_progress"))
            events += self._close()
        self.response = finish(self._shell, self.output, turn)
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self.response)]
