"""One finished chat turn and the items of the same turn streamed, as `gateway/turns/messages.py`
returns and yields them.

Shared by the translation tests of the Messages and Responses surfaces: one turn that reasons,
answers and calls two tools (the first whole, the second as it is sampled: its start, then its
arguments), so a stream translation can be checked against the non-streamed translation of the
same turn.
"""

from __future__ import annotations

from typing import Any

from rlgw.gateway.engine_client.backend import GenerationResult
from rlgw.gateway.parsing.output_parser import ParsedOutput, ToolCall
from rlgw.gateway.turns.messages import ChatDelta, ChatStart, ChatTurn

ID = "chatcmpl-0123abcd"
MODEL = "tiny"
CALLS = [("call_aaa", "get_weather", '{"city": "Paris"}'), ("call_bbb", "get_weather", '{"city": "Tokyo"}')]
PROMPT_TOKENS, OUTPUT_TOKENS, CACHED_TOKENS, REASONING_TOKENS = 50, 20, 8, 6


def turn(finish_reason: str = "tool_calls", matched_stop: Any = None, calls: bool = True) -> ChatTurn:
    """The finished turn; `finish_reason` is the one it reports ("length": the engine's cap cut it)."""
    tool_calls = [ToolCall(i, name, args) for i, (_, name, args) in enumerate(CALLS)] if calls else []
    finish = {"type": "length" if finish_reason == "length" else "stop", "matched": matched_stop}
    result = GenerationResult(
        rid="r",
        output_ids=list(range(OUTPUT_TOKENS)),
        logprobs=[0.0] * OUTPUT_TOKENS,
        finish_reason=finish,
        weight_version="0",
        prompt_tokens=PROMPT_TOKENS,
        cached_tokens=CACHED_TOKENS,
    )
    done = ChatTurn(
        response_id=ID,
        created=1,
        parsed=ParsedOutput("Let me check.", "Two cities.", tool_calls, []),
        call_ids=[cid for cid, _, _ in CALLS] if calls else [],
        result=result,
        prompt_tokens=PROMPT_TOKENS,
        logprobs=None,
        reasoning_tokens=REASONING_TOKENS,
    )
    assert done.finish_reason == finish_reason
    return done


def items(finish_reason: str = "tool_calls", calls: bool = True) -> list[ChatStart | ChatDelta | ChatTurn]:
    """The same turn streamed: its start, reasoning and content in pieces, the calls, the turn."""
    out: list[ChatStart | ChatDelta | ChatTurn] = [
        ChatStart(ID, 1),
        ChatDelta("reasoning", "Two "),
        ChatDelta("reasoning", "cities."),
        ChatDelta("content", "Let me "),
        ChatDelta("content", "check."),
    ]
    if calls:
        (first_id, name, args), (second_id, name2, args2) = CALLS
        out.append(ChatDelta("tool_call", call=ToolCall(0, name, args), call_id=first_id))
        second = ToolCall(1, name2, args2)
        out.append(ChatDelta("tool_call_start", call=second, call_id=second_id))
        out.append(ChatDelta("tool_call_args", args2[:9], call=second))
        out.append(ChatDelta("tool_call_args", args2[9:], call=second))
    out.append(turn(finish_reason, calls=calls))
    return out
