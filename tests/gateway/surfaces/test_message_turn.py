"""The checks every message surface's turn needs, on each surface's own request model.

Anthropic Messages and Responses requests are validated once, in their own wire model, and
translated straight into the chat turn; what the chat request's validation used to catch for
them (a `tool_choice` the tools cannot honour, reserved template kwargs, nothing to answer) is
`surfaces/message_turn.py`'s, with the same 400 as on Chat Completions.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.anthropic import translate as at
from rlgw.gateway.surfaces.openai_chat import ChatCompletionRequest, chat_params
from rlgw.gateway.surfaces.responses import translate as rt

HI = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def messages_params(**fields: Any) -> Any:
    return at.turn_params(at.MessagesRequest.model_validate({"max_tokens": 8, "messages": HI, **fields}))


def responses_params(**fields: Any) -> Any:
    req = rt.ResponsesRequest.model_validate({"input": "hi", **fields})
    return rt.turn_params(req, rt.input_items(req.input))


def chat(**fields: Any) -> Any:
    return chat_params(ChatCompletionRequest.model_validate({"messages": HI, **fields}))


@pytest.mark.parametrize(
    ("build", "fields", "words"),
    [
        (messages_params, {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "not in tools"),
        (messages_params, {"tool_choice": {"type": "any"}}, "needs tools"),
        (messages_params, {"chat_template_kwargs": {"tools": []}}, "may not set 'tools'"),
        (responses_params, {"tools": [FUNCTION], "tool_choice": "any"}, "must be 'auto', 'none'"),
        (responses_params, {"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "x"}}, "not in"),
        (responses_params, {"tool_choice": "required"}, "needs tools"),
        (responses_params, {"chat_template_kwargs": {"as_array": True}}, "may not set 'as_array'"),
        (chat, {"tool_choice": "required"}, "needs tools"),
        (chat, {"tool_choice": "any", "tools": [{"type": "function", "function": {"name": "f"}}]}, "must be"),
    ],
)
def test_what_the_tools_or_the_template_cannot_honour_is_the_same_400_on_every_surface(
    build: Any, fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words):
        build(**fields)


@pytest.mark.parametrize(
    "build",
    [
        lambda: responses_params(input=[]),
        lambda: at.turn_params(
            at.MessagesRequest.model_validate(
                {"max_tokens": 8, "messages": [{"role": "system", "content": ""}]}
            )
        ),
    ],
)
def test_a_request_with_nothing_to_answer_is_a_400(build: Any) -> None:
    with pytest.raises(InvalidRequest, match="no message to answer"):
        build()


def test_tool_ids_and_names_the_template_needs_are_not_empty() -> None:
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "", "content": "x"}]}
    with pytest.raises(InvalidRequest, match="needs tool_use_id"):
        at.turn_params(at.MessagesRequest.model_validate({"max_tokens": 8, "messages": [result]}))
    with pytest.raises(InvalidRequest, match="client tools"):
        messages_params(tools=[{"name": "", "input_schema": {}}])
    output = {"type": "function_call_output", "call_id": "", "output": "x"}
    with pytest.raises(InvalidRequest, match="needs call_id"):
        responses_params(input=[output])
    with pytest.raises(InvalidRequest, match="needs a name"):
        responses_params(tools=[{**FUNCTION, "name": ""}])
