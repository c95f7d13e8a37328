"""The Responses surface's translation: input items -> the chat turn, responses and events back."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.responses import translate as rt
from tests.support import surface_turn as st

ITEMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be terse."},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Weather in Paris and Tokyo?"}],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Two calls."}],
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
    },
    {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city":"Tokyo"}'},
    {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
    {
        "type": "function_call_output",
        "call_id": "call_b",
        "output": [{"type": "input_text", "text": "rainy"}],
    },
]


def test_items_become_chat_messages_with_one_assistant_message_per_turn() -> None:
    assert rt.chat_messages("Instructions.", ITEMS) == [
        {"role": "system", "content": "Instructions."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two calls.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Tokyo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rainy"},
    ]


def test_request_maps_into_chat_params() -> None:
    req = rt.ResponsesRequest.model_validate(
        {
            "input": "Weather in Paris?",
            "tools": [
                {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}
            ],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 32,
            "temperature": 0.0,
            "reasoning": {"effort": "none"},
            "parallel_tool_calls": False,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
    )
    params = rt.turn_params(req, rt.input_items(req.input))
    assert params.messages == [{"role": "user", "content": "Weather in Paris?"}]
    assert params.tools == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    assert params.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert params.max_tokens == 32 and params.parallel_tool_calls is False
    assert params.surface == "responses" and not params.stream
    assert params.template_kwargs == {"enable_thinking": False}
    assert params.sampling == {"temperature": 0.0}


@pytest.mark.parametrize(
    ("items", "words"),
    [
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "only text parts"),
        ([{"type": "item_reference", "id": "x"}], "'item_reference' items"),
        (
            [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f"}],
            "ends with",
        ),
    ],
)
def test_unsupported_items_are_400s(items: list, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        rt.chat_messages(None, items)


def test_tools_no_one_can_run_here_and_structured_output_are_400s() -> None:
    req = rt.ResponsesRequest.model_validate({"input": "x", "tools": [{"type": "computer_use_preview"}]})
    with pytest.raises(InvalidRequest, match="'computer_use_preview' tools are not supported"):
        rt.turn_params(req, rt.input_items(req.input))
    # A hosted tool is left out, not refused: the model is not shown it.
    req = rt.ResponsesRequest.model_validate({"input": "x", "tools": [{"type": "web_search"}]})
    params = rt.turn_params(req, rt.input_items(req.input))
    assert params.tools is None and params.notes == {"dropped_tools": ["web_search"]}
    req = rt.ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_schema"}}})
    with pytest.raises(InvalidRequest, match="constrained decoding"):
        rt.turn_params(req, rt.input_items(req.input))


def test_a_turn_becomes_a_response_whose_call_ids_are_the_minted_ids() -> None:
    req = rt.ResponsesRequest.model_validate({"input": "x"})
    doc = rt.response(req, st.turn(), st.MODEL)
    assert doc["id"] == "resp_0123abcd" and doc["status"] == "completed"
    assert [(i["type"], i.get("call_id")) for i in doc["output"]] == [
        ("reasoning", None),
        ("message", None),
        ("function_call", "call_aaa"),
        ("function_call", "call_bbb"),
    ]
    assert doc["output"][1]["content"][0]["text"] == "Let me check."
    assert doc["usage"]["input_tokens"] == 50 and doc["usage"]["input_tokens_details"]["cached_tokens"] == 8
    assert doc["usage"]["output_tokens_details"] == {"reasoning_tokens": st.REASONING_TOKENS}
    # Echoing the output back is the same assistant turn.
    turn = rt.chat_messages(None, [*doc["output"], {"type": "function_call_output", "call_id": "call_aaa"}])[
        0
    ]
    assert [c["id"] for c in turn["tool_calls"]] == ["call_aaa", "call_bbb"] and turn[
        "content"
    ] == "Let me check."


def test_a_turn_cut_by_length_is_incomplete_and_a_bare_answer_still_has_a_message_item() -> None:
    req = rt.ResponsesRequest.model_validate({"input": "x"})
    doc = rt.response(req, st.turn(finish_reason="length", calls=False), st.MODEL)
    assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": "max_output_tokens"}
    empty = st.turn(finish_reason="stop", calls=False)
    empty.parsed.content, empty.parsed.reasoning_content = "", None
    assert [i["type"] for i in rt.output_items("resp_x", empty)] == ["message"]


@pytest.mark.parametrize("calls", [True, False])
def test_stream_events_accumulate_in_the_sdk_to_the_plain_response(calls: bool) -> None:
    req = rt.ResponsesRequest.model_validate({"input": "x", "stream": True})
    stream = rt.ResponseStream(req, st.MODEL)
    finish = "tool_calls" if calls else "stop"
    events = [e for item in st.items(finish, calls=calls) for e in stream.feed(item)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert ("response.function_call_arguments.delta" in kinds) is calls
    # The openai SDK's own stream state accepts the sequence and ends with the plain response's output.
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        state.handle_event(adapter.validate_python(e))
    plain = rt.response(req, st.turn(finish, calls=calls), st.MODEL)
    assert stream.response is not None and stream.response["output"] == plain["output"]
    assert state._completed_response is not None
    assert [i.id for i in state._completed_response.output] == [i["id"] for i in plain["output"]]


def test_a_failed_stream_ends_with_error_and_response_failed_in_the_sdks_types() -> None:
    stream = rt.ResponseStream(rt.ResponsesRequest.model_validate({"input": "x", "stream": True}), st.MODEL)
    events = [e for item in st.items()[:3] for e in stream.feed(item)]
    events += stream.fail({"message": "engine gone", "type": "upstream_error", "param": None, "code": None})
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(e) for e in events]
    assert [e.type for e in parsed[-2:]] == ["error", "response.failed"]
    assert parsed[-1].response.status == "failed" and parsed[-1].response.error.message == "engine gone"


@pytest.mark.parametrize("finish", ["tool_calls", "length"])
def test_a_response_validates_as_the_sdks_response_type(finish: str) -> None:
    req = rt.ResponsesRequest.model_validate(
        {"input": "x", "tools": [{"type": "function", "name": "get_weather"}]}
    )
    doc = Response.model_validate(rt.response(req, st.turn(finish_reason=finish), st.MODEL))
    assert doc.output_text == "Let me check." and doc.status == (
        "incomplete" if finish == "length" else "completed"
    )
