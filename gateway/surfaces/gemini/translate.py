"""Gemini's `generateContent` <-> the internal chat turn: requests, replies and stream chunks.

A `GenerateContentRequest` is translated straight into the chat turn's parameters (`ChatParams`,
OpenAI-style messages and function tools), so this surface records into one ledger with the
others; the request is validated once, here, and the checks every message turn needs are
`message_turn.py`'s. A finished `ChatTurn` becomes a `GenerateContentResponse`; a streamed turn's
items become its chunks (`streamGenerateContent`). Field names are Gemini's JSON (lowerCamel);
the proto's snake_case spellings are accepted too.

Mapping choices (documented, not invented where the template has no slot):
- roles: `user` (and the older `function`) -> user turns, `model` -> assistant turns; a user
  content's `functionResponse` parts become tool messages at their place, its text parts are
  joined with "\\n" into a user message; a model content's text parts are joined as they are (a
  stream's pieces make its text), its `thought: true` text parts are the reasoning, its
  `functionCall` parts the tool calls;
- `functionCall.id`: replies carry the id the gateway minted, so an echoed call keeps its
  sampled tokens; an echo without ids is matched by its names and arguments (the ledger's
  `calls` echo rule). A `functionResponse` without an id answers the earliest call of that name
  in the model turn before it that is not answered yet;
- a `functionResponse.response` of the one key `output` (Gemini CLI's shape) is the tool
  message's text; any other response object is its JSON text;
- `parameters` (Gemini's OpenAPI schema, upper-case type names) and `parametersJsonSchema`
  are the tool's JSON schema (type names lower-cased);
- `toolConfig.functionCallingConfig.mode`: AUTO and VALIDATED -> "auto", ANY -> "required" (or
  the one function `allowedFunctionNames` names), NONE -> "none"; several allowed names
  are a 400 (the grammar constrains to one function or to all);
- `generationConfig`: temperature, topP, topK, seed, presencePenalty, frequencyPenalty,
  maxOutputTokens, stopSequences; `candidateCount` above 1 is a 400 (one turn, one sample);
  `responseMimeType: application/json` constrains the output to `responseJsonSchema` or
  `responseSchema` (else any JSON object); `thinkingConfig.thinkingBudget: 0` turns the
  template's reasoning off, another budget or a `thinkingLevel` on (the budget is not enforced),
  and `includeThoughts` says whether thought parts are returned;
- replies: `finishReason` MAX_TOKENS at the length cap, else STOP (a function call too, as
  Gemini's own); `usageMetadata` counts the thoughts apart (`thoughtsTokenCount`) from
  `candidatesTokenCount`, their sum and the prompt making `totalTokenCount`;
- `safetySettings`, `cachedContent`, `labels`, thought signatures and other fields are accepted
  and ignored (a part holding only a thought signature adds nothing); parts other than text,
  functionCall and functionResponse (inline data, files, executable code) are a 400.

This module knows nothing about HTTP, sessions or the engine.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.message_turn import checked
from rlgw.gateway.turns.messages import ChatDelta, ChatParams, ChatStart, ChatTurn

SURFACE = "gemini"
_MODES = {"AUTO": "auto", "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto", "ANY": "required", "NONE": "none"}
_USER_ROLES = ("user", "function")
_JSON = "application/json"


class _Camel(BaseModel):
    """Gemini's JSON field names (lowerCamel), its proto's snake_case accepted too."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True)


class ThinkingConfig(_Camel):
    """`generationConfig.thinkingConfig`."""

    include_thoughts: bool = False
    thinking_budget: int | None = None
    thinking_level: str | None = None


class GenerationConfig(_Camel):
    """`generationConfig`: sampling, length, stops, the output's form and thinking."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    max_output_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    candidate_count: int | None = Field(None, ge=1)
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = None
    thinking_config: ThinkingConfig | None = None


class FunctionCallingConfig(_Camel):
    """`toolConfig.functionCallingConfig`."""

    mode: str = "AUTO"
    allowed_function_names: list[str] | None = None


class ToolConfig(_Camel):
    """`toolConfig`."""

    function_calling_config: FunctionCallingConfig | None = None


class Content(_Camel):
    """One turn of `contents` (or the `systemInstruction`): a role and its parts."""

    role: str | None = None
    parts: list[dict[str, Any]] = Field(default_factory=list)


class GenerateContentRequest(_Camel):
    """The body of `models/{model}:generateContent` and `:streamGenerateContent`."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | None = None
    tools: list[dict[str, Any]] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig = Field(default_factory=GenerationConfig)


def _part_kind(part: dict[str, Any], where: str) -> str:
    """The part's kind: text, functionCall or functionResponse; "" for a part that carries only a
    thought signature or metadata (nothing the template renders)."""
    for kind in ("text", "functionCall", "functionResponse"):
        if kind in part:
            return kind
    for snake, kind in (("function_call", "functionCall"), ("function_response", "functionResponse")):
        if snake in part:
            part[kind] = part[snake]
            return kind
    named = [
        k for k in part if k not in ("thought", "thoughtSignature", "thought_signature", "videoMetadata")
    ]
    if not named:
        return ""
    raise InvalidRequest(
        f"{where}: only text, functionCall and functionResponse parts are supported, got {named}",
        param="contents",
    )


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be an object", param="contents")
    return value


def _named(value: dict[str, Any], where: str) -> str:
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.name must be a non-empty string", param="contents")
    return name


def _tool_text(response: dict[str, Any]) -> str:
    """What the model sees of a function's response (Gemini CLI sends `{"output": text}`)."""
    if list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def _text(part: dict[str, Any], where: str) -> str:
    if not isinstance(part["text"], str):
        raise InvalidRequest(f"{where}.text must be a string", param="contents")
    return part["text"]


def _model_turn(content: Content, i: int) -> dict[str, Any]:
    """A model content: text -> content, thought text -> reasoning, functionCall -> tool_calls."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(content.parts):
        where = f"contents[{i}].parts[{j}]"
        kind = _part_kind(part, where)
        if not kind:
            continue
        if kind == "text":
            (thoughts if part.get("thought") else texts).append(_text(part, where))
        elif kind == "functionCall":
            call = _object(part["functionCall"], f"{where}.functionCall")
            name = _named(call, f"{where}.functionCall")
            args = json.dumps(_object(call.get("args"), f"{where}.functionCall.args"), ensure_ascii=False)
            tool_call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
            if call.get("id"):
                tool_call["id"] = str(call["id"])
            calls.append(tool_call)
        else:
            raise InvalidRequest(f"{where}: a functionResponse belongs in a user turn", param="contents")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user_turn(content: Content, i: int, open_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user content: its text, and each functionResponse as a tool message, in part order.

    `open_calls` are the calls of the model turn before it not answered yet (a response without
    an id answers the earliest of its name)."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, part in enumerate(content.parts):
        where = f"contents[{i}].parts[{j}]"
        kind = _part_kind(part, where)
        if not kind:
            continue
        if kind == "text":
            texts.append(_text(part, where))
            continue
        if kind == "functionCall":
            raise InvalidRequest(f"{where}: a functionCall belongs in a model turn", param="contents")
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        response = _object(part["functionResponse"], f"{where}.functionResponse")
        name = _named(response, f"{where}.functionResponse")
        call_id = str(response.get("id") or "")
        answered = next(
            (c for c in open_calls if (c.get("id") == call_id if call_id else c["function"]["name"] == name)),
            None,
        )
        if answered is not None:
            open_calls.remove(answered)
            call_id = call_id or answered.get("id", "")
        body = _tool_text(_object(response.get("response"), f"{where}.functionResponse.response"))
        msg = {"role": "tool", "name": name, "content": body}
        if call_id:
            msg["tool_call_id"] = call_id
        out.append(msg)
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def system_text(content: Content | None) -> str:
    """The system instruction's text (its text parts joined with "\\n")."""
    if content is None:
        return ""
    texts = []
    for j, part in enumerate(content.parts):
        kind = _part_kind(part, f"systemInstruction.parts[{j}]")
        if not kind:
            continue
        if kind != "text":
            raise InvalidRequest("systemInstruction holds only text parts", param="systemInstruction")
        texts.append(_text(part, f"systemInstruction.parts[{j}]"))
    return "\n".join(texts)


def chat_messages(req: GenerateContentRequest) -> list[dict[str, Any]]:
    """OpenAI-style chat messages for a request's system instruction and contents."""
    out: list[dict[str, Any]] = []
    if system := system_text(req.system_instruction):
        out.append({"role": "system", "content": system})
    open_calls: list[dict[str, Any]] = []
    for i, content in enumerate(req.contents):
        role = content.role or "user"
        if role == "model":
            msg = _model_turn(content, i)
            open_calls = list(msg.get("tool_calls") or [])
            out.append(msg)
        elif role in _USER_ROLES:
            out.extend(_user_turn(content, i, open_calls))
        else:
            raise InvalidRequest(
                f"contents[{i}].role must be 'user' or 'model', not {role!r}", param="contents"
            )
    if req.contents[-1].role == "model":
        raise InvalidRequest(
            "the last content is the model's: every request starts a new model turn", param="contents"
        )
    return out


def json_schema(schema: Any) -> Any:
    """A Gemini `Schema` (OpenAPI's subset, type names such as "STRING") as JSON schema."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(s) for name, s in value.items()}
        else:
            out[key] = json_schema(value) if isinstance(value, dict | list) else value
    return out


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools for Gemini tools' `functionDeclarations` (other tools are a 400)."""
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        declarations = tool.get("functionDeclarations", tool.get("function_declarations"))
        others = [k for k in tool if k not in ("functionDeclarations", "function_declarations")]
        if others or not isinstance(declarations, list):
            raise InvalidRequest(
                f"tools[{i}]: only functionDeclarations are supported, not {others or 'none'}", param="tools"
            )
        for j, decl in enumerate(declarations):
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str) or not decl["name"]:
                raise InvalidRequest(f"tools[{i}].functionDeclarations[{j}] needs a name", param="tools")
            fn: dict[str, Any] = {"name": decl["name"]}
            if decl.get("description"):
                fn["description"] = decl["description"]
            schema = decl.get("parametersJsonSchema", decl.get("parameters_json_schema"))
            if schema is None and decl.get("parameters") is not None:
                schema = json_schema(decl["parameters"])
            fn["parameters"] = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
            out.append({"type": "function", "function": fn})
    return out


def tool_choice(config: ToolConfig | None) -> str | dict[str, Any] | None:
    """The OpenAI `tool_choice` of a `toolConfig` (None: the default)."""
    fcc = config.function_calling_config if config is not None else None
    if fcc is None:
        return None
    mode = fcc.mode.upper()
    if mode not in _MODES:
        raise InvalidRequest(
            f"toolConfig.functionCallingConfig.mode must be one of {sorted(_MODES)}, not {fcc.mode!r}",
            param="toolConfig",
        )
    names = fcc.allowed_function_names or []
    if mode != "ANY" or not names:
        return _MODES[mode]
    if len(names) > 1:
        raise InvalidRequest(
            "allowedFunctionNames may name one function (a call to any of several is not supported)",
            param="toolConfig",
        )
    return {"type": "function", "function": {"name": names[0]}}


def _sampling(config: GenerationConfig) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty"):
        if (value := getattr(config, name)) is not None:
            sampling[name] = value
    if config.seed is not None:
        sampling["sampling_seed"] = config.seed
    if config.stop_sequences:
        sampling["stop"] = config.stop_sequences
    if config.response_mime_type == _JSON:
        schema = config.response_json_schema or (
            json_schema(config.response_schema) if config.response_schema else {"type": "object"}
        )
        sampling["json_schema"] = json.dumps(schema)
    elif config.response_mime_type not in (None, "text/plain"):
        raise InvalidRequest(
            f"responseMimeType {config.response_mime_type!r} is not supported (text/plain, application/json)",
            param="generationConfig",
        )
    return sampling


def _template_kwargs(config: GenerationConfig) -> dict[str, Any]:
    thinking = config.thinking_config
    if thinking is None or (thinking.thinking_budget is None and thinking.thinking_level is None):
        return {}
    return {"enable_thinking": thinking.thinking_budget != 0}


def turn_params(req: GenerateContentRequest, *, stream: bool, event: str | None = None) -> ChatParams:
    """The chat turn's parameters for a Gemini request (400s for what the turn cannot take)."""
    config = req.generation_config
    if (config.candidate_count or 1) > 1:
        raise InvalidRequest(
            "candidateCount must be 1: each turn is one recorded sample", param="generationConfig"
        )
    params = ChatParams(
        messages=chat_messages(req),
        tools=chat_tools(req.tools or []) or None,
        tool_choice=tool_choice(req.tool_config),
        parallel_tool_calls=True,
        sampling=_sampling(config),
        max_tokens=config.max_output_tokens,
        logprobs=False,
        top_logprobs=0,
        stream=stream,
        include_usage=stream,
        template_kwargs=_template_kwargs(config),
        surface=SURFACE,
        event=event,
    )
    return checked(params)


def include_thoughts(req: GenerateContentRequest) -> bool:
    """Whether the reply carries the reasoning as thought parts."""
    thinking = req.generation_config.thinking_config
    return thinking is not None and thinking.include_thoughts


def finish_reason(turn: ChatTurn) -> str:
    """Gemini's finishReason (a function call ends with STOP, as Gemini's own do)."""
    return "MAX_TOKENS" if turn.finish_reason == "length" else "STOP"


def usage(turn: ChatTurn) -> dict[str, int]:
    """`usageMetadata`: Gemini counts the thoughts apart from the candidates' tokens."""
    output = len(turn.result.output_ids)
    thoughts = min(turn.reasoning_tokens, output)
    doc = {
        "promptTokenCount": turn.prompt_tokens,
        "candidatesTokenCount": output - thoughts,
        "totalTokenCount": turn.prompt_tokens + output,
    }
    if thoughts:
        doc["thoughtsTokenCount"] = thoughts
    if turn.result.cached_tokens:
        doc["cachedContentTokenCount"] = turn.result.cached_tokens
    return doc


def _args(arguments: str) -> dict[str, Any]:
    # A call whose sampled arguments do not parse (the sample's metadata flags it) gets empty
    # args: Gemini's `args` is an object.
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def call_parts(turn: ChatTurn) -> list[dict[str, Any]]:
    """The turn's tool calls as functionCall parts, each with the id the gateway minted."""
    return [
        {"functionCall": {"id": cid, "name": call.name, "args": _args(call.arguments)}}
        for call, cid in zip(turn.parsed.tool_calls, turn.call_ids, strict=True)
    ]


def response_id(turn_id: str) -> str:
    """The responseId of a turn: the response id the ledger recorded, without its prefix."""
    return turn_id.removeprefix("chatcmpl-")


def _candidate(parts: list[dict[str, Any]], reason: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if reason is not None:
        candidate["finishReason"] = reason
    return candidate


def response(turn: ChatTurn, model: str, *, thoughts: bool) -> dict[str, Any]:
    """The GenerateContentResponse for a finished turn of `model`."""
    parsed = turn.parsed
    parts: list[dict[str, Any]] = []
    if thoughts and parsed.reasoning_content:
        parts.append({"text": parsed.reasoning_content, "thought": True})
    if parsed.content:
        parts.append({"text": parsed.content})
    parts += call_parts(turn)
    return {
        "candidates": [_candidate(parts, finish_reason(turn))],
        "usageMetadata": usage(turn),
        "modelVersion": model,
        "responseId": response_id(turn.response_id),
    }


class ResponseStream:
    """A streamed turn's items -> `streamGenerateContent` chunks.

    Text and (if asked for) thoughts go out as they are sampled, a chunk each; Gemini sends a
    function call whole, so calls go out in the last chunk, with the finishReason and the
    usage, once the turn is parsed."""

    def __init__(self, model: str, *, thoughts: bool) -> None:
        self._model = model
        self._thoughts = thoughts
        self._id = ""

    def feed(self, item: ChatStart | ChatDelta | ChatTurn) -> list[dict[str, Any]]:
        """The chunks for one item of the turn."""
        if isinstance(item, ChatStart):
            self._id = response_id(item.response_id)
            return []
        if isinstance(item, ChatDelta):
            if item.kind == "content" and item.text:
                return [self._chunk([{"text": item.text}])]
            if item.kind == "reasoning" and item.text and self._thoughts:
                return [self._chunk([{"text": item.text, "thought": True}])]
            return []
        last = self._chunk(call_parts(item), finish_reason(item))
        last["usageMetadata"] = usage(item)
        return [last]

    def _chunk(self, parts: list[dict[str, Any]], reason: str | None = None) -> dict[str, Any]:
        return {
            "candidates": [_candidate(parts, reason)],
            "modelVersion": self._model,
            "responseId": self._id,
        }
