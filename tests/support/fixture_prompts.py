"""Canonical prompts for the committed test models (`tests/fixtures/tiny-qwen3`, `tiny-chatml`).

The fixtures were overfitted on conversations of exactly these shapes (`tests/fixtures/build_fixtures.py`
imports this module), so greedy decoding of each prompt below is deterministic; `tests/fixtures/README.md`
lists the outputs. Messages are OpenAI-style dicts. Qwen3 prompts are rendered with the real Qwen3
template (`tools=TOOLS`); SmolLM2's ChatML template ignores `tools`, so the ChatML prompts carry the tool list
inside the system message (`chatml_tool_system`) and earlier tool calls as plain assistant text
(`tool_call_text`).

This module owns only data and the two text helpers; it knows nothing about tokenizers or models.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]

GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
LIST_FILES: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "list_files",
        "description": "List the files in a directory.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Directory path"}},
            "required": ["path"],
        },
    },
}
TOOLS: list[dict[str, Any]] = [GET_WEATHER, LIST_FILES]


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style `tool_calls` entry (arguments as a JSON string, as OpenAI sends them)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One hermes/qwen25 tool-call block, byte for byte as the Qwen3 template renders it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def chatml_tool_system(tools: list[dict[str, Any]]) -> str:
    """The system message telling the tiny ChatML model which tools it may call (a JSON schema a line)."""
    lines = "\n".join(json.dumps(t["function"]) for t in tools)
    return (
        "You may call these tools:\n"
        + lines
        + '\nTo call a tool, reply with <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call>'
    )


def weather_result(city: str, conditions: str, temp_c: int) -> str:
    """What a `get_weather` tool returns in the training data and the canonical prompts."""
    return json.dumps({"city": city, "conditions": conditions, "temp_c": temp_c})


# ---- Qwen3 (real template; pass tools=TOOLS where the name says so) ----

PLAIN: list[Message] = [{"role": "user", "content": "What is the capital of France?"}]
"""No tools: a plain answer ending in <|im_end|>."""

WEATHER: list[Message] = [{"role": "user", "content": "What is the weather in Paris?"}]
"""With tools=TOOLS: one get_weather call for Paris."""

TWO_CITIES: list[Message] = [{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}]
"""With tools=TOOLS: two parallel get_weather calls, Paris then Tokyo."""

LIST_TMP: list[Message] = [{"role": "user", "content": "List the files in /tmp/data."}]
"""With tools=TOOLS: one list_files call for /tmp/data."""

WEATHER_CALL = tool_call("call_0", "get_weather", {"city": "Paris"})
AFTER_TOOL: list[Message] = [
    *WEATHER,
    {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": weather_result("Paris", "sunny", 21)},
]
"""With tools=TOOLS: a plain final answer (no tool call) after the tool result."""

TWO_CITIES_AFTER_TOOLS: list[Message] = [
    *TWO_CITIES,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            tool_call("call_0", "get_weather", {"city": "Paris"}),
            tool_call("call_1", "get_weather", {"city": "Tokyo"}),
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": weather_result("Paris", "sunny", 21)},
    {"role": "tool", "tool_call_id": "call_1", "content": weather_result("Tokyo", "rainy", 14)},
]
"""With tools=TOOLS: a plain final answer after two grouped tool results."""

SECOND_QUERY: list[Message] = [
    *AFTER_TOOL,
    {"role": "assistant", "content": "It is sunny and 21 C in Paris."},
    {"role": "user", "content": "What is the weather in Berlin?"},
]
"""With tools=TOOLS: a new user turn after a finished tool loop: one get_weather call for Berlin."""

DEEP_ROUNDS: list[tuple[str, str, int]] = [
    ("Paris", "sunny", 21),
    ("Berlin", "cloudy", 15),
    ("Tokyo", "rainy", 14),
]
"""(city, conditions, temp_c) of a three-query tool loop: each user turn "What is the weather in {city}?"
gets one get_weather call, then the tool result, then a plain answer (tools=TOOLS, thinking on or off)."""

# ---- ChatML (SmolLM2's template; tools live in the system message) ----

CHATML_SYSTEM = chatml_tool_system(TOOLS)
CHATML_PLAIN: list[Message] = list(PLAIN)
"""No system message (the template adds SmolLM2's default one): a plain answer."""

CHATML_WEATHER: list[Message] = [{"role": "system", "content": CHATML_SYSTEM}, *WEATHER]
"""One get_weather call for Paris, as text."""

CHATML_TWO_CITIES: list[Message] = [{"role": "system", "content": CHATML_SYSTEM}, *TWO_CITIES]
"""Two get_weather calls (Paris, Tokyo) separated by a newline."""

CHATML_LIST_TMP: list[Message] = [{"role": "system", "content": CHATML_SYSTEM}, *LIST_TMP]
"""One list_files call for /tmp/data."""

CHATML_AFTER_TOOL: list[Message] = [
    *CHATML_WEATHER,
    {"role": "assistant", "content": tool_call_text("get_weather", {"city": "Paris"})},
    {"role": "tool", "content": weather_result("Paris", "sunny", 21)},
]
"""A plain final answer after the tool result."""

CHATML_SECOND_QUERY: list[Message] = [
    *CHATML_AFTER_TOOL,
    {"role": "assistant", "content": "It is sunny and 21 C in Paris."},
    {"role": "user", "content": "What is the weather in Berlin?"},
]
"""A new user turn after a finished tool loop: one get_weather call for Berlin."""
