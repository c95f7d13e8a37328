"""History sync rules at their edges, through the Ledger's public methods (no engine, no template).

What comes back of the history must be what was consumed: a tool result resent under another
`tool_call_id`, or an echoed assistant turn that carries some but not all of the tool calls the
gateway minted for it, is a history change (a `Violation`), never an extension. Only whether
`sync` answers a `Violation` is asserted, so these hold whatever else `sync` returns.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlgw.gateway.ledger.ledger import Ledger, TurnCommit, Violation

USER = {"role": "user", "content": "Weather in Paris and Rome?"}


def call(call_id: str, city: str) -> dict[str, Any]:
    fn = {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}
    return {"id": call_id, "type": "function", "function": fn}


def assistant(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def commit(ledger: Ledger, new: list[dict[str, Any]], out: list[int], calls=(), content: str = "") -> None:
    ledger.commit(
        TurnCommit(
            new_messages=new,
            prompt_ids=[1, 2, 3],  # the rendered increment; its values do not matter here
            output_ids=out,
            logprobs=[-0.5] * len(out),
            version_spans=[],
            response_id="chatcmpl-x",
            tool_call_ids=tuple(calls),
            content=content,
            rid="r",
            finish_type="stop",
            ended_with_stop_token=True,
            parse_errors=[],
        ),
        "v1",
    )


CALL_A, CALL_B = call("call_a", "Paris"), call("call_b", "Rome")


@pytest.fixture
def two_calls() -> Ledger:
    """A ledger whose one generated turn minted two tool calls, call_a and call_b."""
    ledger = Ledger()
    commit(ledger, [USER], [10, 11, 12, 13], calls=["call_a", "call_b"])
    return ledger


def test_both_minted_calls_echoed_in_any_order_extend_the_history(two_calls: Ledger) -> None:
    results = [tool("call_a", "sunny"), tool("call_b", "rain")]
    for echo in (assistant(CALL_A, CALL_B), assistant(CALL_B, CALL_A)):
        assert not isinstance(two_calls.sync([USER, echo, *results]), Violation)


@pytest.mark.parametrize(
    "echo",
    [
        assistant(CALL_A),
        assistant(CALL_B),
        assistant(CALL_A, CALL_B, call("call_c", "Oslo")),
        assistant(CALL_A, call("call_x", "Rome")),
        {"role": "assistant", "content": "I will check the weather."},
    ],
    ids=["only-first", "only-second", "one-extra", "one-renamed", "no-calls"],
)
def test_an_echo_that_does_not_carry_exactly_the_minted_calls_is_a_change(
    two_calls: Ledger, echo: dict[str, Any]
) -> None:
    got = two_calls.sync([USER, echo, tool("call_a", "sunny")])
    assert isinstance(got, Violation) and got.index == 1


# The two-call turn, both tool results, and the answer the gateway generated after them.
HISTORY = [
    USER,
    assistant(CALL_A, CALL_B),
    tool("call_a", "sunny"),
    tool("call_b", "rain"),
    {"role": "assistant", "content": "Sunny in Paris, rain in Rome."},
]


@pytest.fixture
def after_tool_results(two_calls: Ledger) -> Ledger:
    """The two-call turn, then a second turn that consumed both tool results and answered."""
    assert not isinstance(two_calls.sync(HISTORY[:4]), Violation)
    commit(two_calls, HISTORY[2:4], [30, 31], content=HISTORY[4]["content"])
    return two_calls


def test_consumed_tool_results_resent_unchanged_extend_the_history(after_tool_results: Ledger) -> None:
    follow = {"role": "user", "content": "And tomorrow?"}
    assert not isinstance(after_tool_results.sync([*HISTORY, follow]), Violation)


@pytest.mark.parametrize(
    ("index", "changed"),
    [
        (2, tool("call_b", "sunny")),  # the first result now claims to answer the second call
        (3, tool("call_a", "rain")),
        (2, tool("call_zzz", "sunny")),  # an id the gateway never minted
        (2, tool("call_a", "cloudy")),  # same id, other content
        (2, {"role": "user", "content": "sunny"}),  # same content, other role
    ],
    ids=["swapped-id-1", "swapped-id-2", "unknown-id", "content", "role"],
)
def test_a_consumed_tool_result_resent_differently_is_a_change(
    after_tool_results: Ledger, index: int, changed: dict[str, Any]
) -> None:
    history = [*HISTORY, {"role": "user", "content": "And tomorrow?"}]
    history[index] = changed
    got = after_tool_results.sync(history)
    assert isinstance(got, Violation) and got.index == index
