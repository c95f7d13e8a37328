"""The Messages surface's translation: Anthropic requests -> the chat turn, replies and events back."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.surfaces.anthropic import translate as at
from tests.support import surface_turn as st

CONVERSATION: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather in Paris?", "cache_control": {"type": "ephemeral"}}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "And Berlin?"},
        ],
    },
]


def request(**fields: Any) -> at.MessagesRequest:
    return at.MessagesRequest.model_validate({"max_tokens": 64, "messages": CONVERSATION, **fields})


def test_conversation_becomes_chat_messages() -> None:
    system = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Be exact.", "cache_control": {}},
    ]
    assert at.chat_messages(system, CONVERSATION) == [
        {"role": "system", "content": "You are terse.\nBe exact."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "And Berlin?"},
    ]


def test_tool_results_keep_block_order_and_error_results_pass_their_text() -> None:
    content = [
        {"type": "text", "text": "first"},
        {"type": "tool_result", "tool_use_id": "a", "content": "boom", "is_error": True},
        {"type": "tool_result", "tool_use_id": "b"},
    ]
    assert at.chat_messages(None, [{"role": "user", "content": content}]) == [
        {"role": "user", "content": "first"},
        {"role": "tool", "tool_call_id": "a", "content": "boom"},
        {"role": "tool", "tool_call_id": "b", "content": ""},
    ]


def test_request_maps_tools_choice_thinking_and_sampling_into_chat_params() -> None:
    tools = [
        {
            "name": "get_weather",
            "description": "Weather.",
            "input_schema": {"type": "object"},
            "cache_control": {},
        }
    ]
    req = request(
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["END"],
        temperature=0.5,
        top_k=5,
        metadata={"user_id": "u"},
        stream=True,
    )
    params = at.turn_params(req)
    assert params.tools == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}},
        }
    ]
    assert params.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert params.parallel_tool_calls is False
    assert params.template_kwargs == {"enable_thinking": True}
    assert params.sampling == {"temperature": 0.5, "top_k": 5, "stop": ["END"]}
    assert params.max_tokens == 64 and params.stream and params.surface == "messages"


@pytest.mark.parametrize(("choice", "expected"), [("any", "required"), ("auto", "auto"), ("none", "none")])
def test_tool_choice_kinds(choice: str, expected: str) -> None:
    req = request(tools=[{"name": "t", "input_schema": {}}], tool_choice={"type": choice})
    assert at.turn_params(req).tool_choice == expected


def test_thinking_disabled_turns_the_switch_off_and_chat_template_kwargs_win() -> None:
    params = at.turn_params(request(thinking={"type": "disabled"}))
    assert params.template_kwargs == {"enable_thinking": False}
    req = request(thinking={"type": "disabled"}, chat_template_kwargs={"enable_thinking": True})
    assert at.turn_params(req).template_kwargs == {"enable_thinking": True}
    assert at.turn_params(request()).template_kwargs == {}


@pytest.mark.parametrize(
    ("messages", "tools", "words"),
    [
        ([{"role": "user", "content": [{"type": "image", "source": {}}]}], None, "'image' blocks"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}], None, "prefill"),
        ([{"role": "developer", "content": "hi"}], None, "'user', 'assistant' or 'system'"),
        (
            [{"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "tool_addition"}]}],
            None,
            "'tool_addition' blocks are not supported in a system message",
        ),
        (
            [{"role": "user", "content": "hi"}],
            [{"type": "web_search_20250305", "name": "web"}],
            "client tools",
        ),
    ],
)
def test_unsupported_shapes_are_400s(messages: list, tools: list | None, words: str) -> None:
    req = at.MessagesRequest.model_validate({"max_tokens": 8, "messages": messages, "tools": tools})
    with pytest.raises(InvalidRequest, match=words):
        at.turn_params(req)


def test_a_turn_becomes_a_message_with_the_minted_tool_ids() -> None:
    msg = at.message(st.turn(), st.MODEL)
    assert msg["id"] == "msg_0123abcd" and msg["stop_reason"] == "tool_use"
    assert msg["content"] == [
        {"type": "thinking", "thinking": "Two cities.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_aaa", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_bbb", "name": "get_weather", "input": {"city": "Tokyo"}},
    ]
    assert msg["usage"] == {
        "input_tokens": 42,  # the prompt's 50 tokens less the 8 read from the cache
        "output_tokens": 20,
        "cache_read_input_tokens": 8,
        "cache_creation_input_tokens": 0,
    }


@pytest.mark.parametrize(
    ("finish", "matched", "expected"),
    [
        ("stop", None, ("end_turn", None)),
        ("stop", 151645, ("end_turn", None)),
        ("stop", "END", ("stop_sequence", "END")),
        ("length", None, ("max_tokens", None)),
        ("tool_calls", None, ("tool_use", None)),
    ],
)
def test_stop_reasons(finish: str, matched: Any, expected: tuple) -> None:
    assert at.stop_reason(finish, matched) == expected


def test_stream_events_follow_anthropics_sequence_and_accumulate_to_the_plain_reply() -> None:
    stream = at.MessageStream(st.MODEL)
    events = [e for item in st.items() for e in stream.feed(item)]
    summary = [
        (e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
        for e in events
    ]
    assert summary == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),  # the arguments as they were sampled
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    # Each event is one of the SDK's stream event types, strictly validated.
    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in events:
        adapter.validate_python(e)
    # The SDK's own accumulator turns the events into the message the plain reply is.
    snapshot, bufs = None, {}
    for e in events:
        snapshot = accumulate_event(event=e, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    plain = at.message(st.turn(), st.MODEL)
    got = snapshot.to_dict()
    for key in ("id", "content", "stop_reason", "stop_sequence", "usage"):
        assert got[key] == plain[key], key


def test_a_reply_validates_as_the_sdks_message_type() -> None:
    msg = Message.model_validate(at.message(st.turn(), st.MODEL))
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
