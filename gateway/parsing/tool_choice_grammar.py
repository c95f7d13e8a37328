"""`tool_choice` as a grammar: the structural tag that makes the model call a tool, in its template's format.

OpenAI's `tool_choice: "required"` and a named function (Anthropic's `{"type": "any"}` and
`{"type": "tool", "name": ...}`, which the Messages surface translates to those) promise a call.
As SGLang and vLLM do, the promise is kept by constrained decoding: the engine gets an xgrammar
structural tag (SGLang's `structural_tag` sampling param, `{"type": "structural_tag", "format": ...}`)
whose only outputs are one call (or, when parallel calls are allowed, several separated by a newline)
of the allowed tools, each in the exact text the template's tool format parses back
(`tool_calls.py`), the arguments held to the tool's JSON schema; the model's EOS ends it. A model
that reasons may open its think block first (free text up to `</think>`), or must close it when the
prompt already opened it. Unlike SGLang's (whose JSON-array schema lets the model write calls in a
shape its template never shows), the tag follows the template, so the sampled tokens are the
template's own call tokens and the ledger records them as any other turn.

Formats: ``hermes`` and ``qwen25`` (``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``,
as Qwen's and Hermes' templates render a call) and ``qwen3_coder`` (``<function=NAME>`` with
``<parameter=KEY>`` blocks, xgrammar's `qwen_xml` JSON style).

The logprobs of a constrained turn are those of the masked distribution (the engine masks before
its softmax), which a trainer's forward pass without the grammar does not reproduce: the turn layer
notes every constrained turn in the sample's metadata. This module builds the tag only; it knows
nothing about the engine, the ledger or HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.parsing.reasoning import THINK_END, THINK_START
from rlgw.gateway.parsing.tool_calls import TOOL_CALL_END, TOOL_CALL_START

# The metadata key that lists the response ids of the turns a tool_choice grammar constrained.
CONSTRAINED_NOTE = "tool_choice_constrained"
_ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolChoiceGrammar:
    """The structural tag for one turn (`source`, the sampling param's JSON) and what it allows."""

    source: str
    names: tuple[str, ...]
    parallel: bool


def forced_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The function tools `tool_choice` obliges the model to pick from, or None when it obliges nothing."""
    if not tools:
        return None
    if tool_choice == "required":
        return [t for t in tools if t.get("type", "function") == "function"]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        return [t for t in tools if (t.get("function") or {}).get("name") == name]
    return None


def tool_choice_grammar(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    *,
    tool_format: str | None,
    parallel: bool,
    reasoning: bool,
    reasoning_forced: bool,
) -> ToolChoiceGrammar | None:
    """The grammar that keeps `tool_choice`'s promise, or None when it promises no call.

    `tool_format`: the template's (the model profile's); `parallel`: the request's
    `parallel_tool_calls`; `reasoning`: the model writes think blocks; `reasoning_forced`: the
    prompt already opened one. A promise that cannot be kept in the format is an `InvalidRequest`.
    """
    forced = forced_tools(tools, tool_choice)
    if not forced:
        return None
    if tool_format not in ("hermes", "qwen25", "qwen3_coder"):
        raise InvalidRequest(
            f"tool_choice={json.dumps(tool_choice)} needs a grammar over the template's tool-call format, "
            f"and the model's format ({tool_format}) has none; use tool_choice 'auto'",
            param="tool_choice",
        )
    tags = [_call_tag(t["function"], tool_format) for t in forced]
    calls = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
             "stop_after_first": not parallel}  # fmt: skip
    elements: list[dict[str, Any]] = []
    if reasoning_forced:  # the prompt ends inside the think block: close it first
        elements.append({"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": THINK_END})
    elif reasoning:
        think = {"type": "tag", "begin": THINK_START, "content": {"type": "any_text"}, "end": THINK_END}
        elements.append({"type": "optional", "content": think})
    if elements:
        elements.append({"type": "regex", "pattern": r"\s*"})
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [*elements, calls]}}
    names = tuple(t["function"]["name"] for t in forced)
    return ToolChoiceGrammar(json.dumps(tag, ensure_ascii=False), names, parallel)


def _call_tag(function: dict[str, Any], tool_format: str) -> dict[str, Any]:
    """One tool's call, as the format writes it, its arguments held to the tool's schema."""
    name, schema = function["name"], function.get("parameters") or _ANY_OBJECT
    if tool_format == "qwen3_coder":
        return {
            "type": "tag",
            "begin": f"{TOOL_CALL_START}\n<function={name}>\n",
            "content": {"type": "json_schema", "json_schema": schema, "style": "qwen_xml"},
            "end": f"\n</function>\n{TOOL_CALL_END}",
        }
    # The call object as the template renders it (`tojson`: `"key": value`), arguments last.
    return {
        "type": "tag",
        "begin": f'{TOOL_CALL_START}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": ',
        "content": {"type": "json_schema", "json_schema": schema},
        "end": f"}}\n{TOOL_CALL_END}",
    }
