"""The ledger's rules at their edges, through its public methods (no engine, no template).

Completions prompts that extend (or do not extend) the text and ids of earlier turns; switching
API surface or tool list; the echo rules (ids in tool_calls, calls without ids, ids named in text,
edits recorded);
signatures that ignore spelling but not meaning; retries and rollback that restore every array;
segments, passthrough, and the samples built from them (status, metadata, version spans).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlgw.gateway.content import content_text
from rlgw.gateway.ledger.ledger import (
    Cause,
    Ledger,
    TurnCommit,
    Violation,
    canonical_arguments,
    message_digest,
    tools_digest,
)
from rlgw.gateway.sample import SampleStatus, VersionSpan, validate_sample

USER = {"role": "user", "content": "Weather in Paris?"}
ID_A, ID_B = "call_" + "a" * 24, "call_" + "b" * 24  # the shape of ids the gateway mints


def turn(new: list[dict[str, Any]] | None, prompt: list[int], out: list[int], **kw: Any) -> TurnCommit:
    fields: dict[str, Any] = {
        "new_messages": new,
        "prompt_ids": prompt,
        "output_ids": out,
        "logprobs": [-0.25] * len(out),
        "version_spans": [],
        "response_id": "chatcmpl-1",
        "tool_call_ids": (),
        "content": "",
        "rid": "rid-1",
        "finish_type": "stop",
        "ended_with_stop_token": True,
        "parse_errors": [],
    }
    fields.update(kw)
    return TurnCommit(**fields)


def call(call_id: str, args: str = '{"city": "Paris"}', name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def violation(got: Any, cause: str, index: int = 0) -> None:
    assert isinstance(got, Violation), got
    assert (got.cause, got.index) == (cause, index) and str(got) == got.detail


# -- completions prompts ------------------------------------------------------------------------


def test_completions_text_prompts_extend_the_text_seen() -> None:
    ledger = Ledger()
    assert ledger.sync_prompt("Once") == "Once"  # nothing seen yet: all of it is new
    ledger.commit(turn(None, [1, 2], [3, 4], surface="completions", agent_text="Once upon"), "v1")
    assert ledger.sync_prompt("Once upon a time") == " a time"
    assert ledger.sync_prompt("Once upon") == ""
    violation(ledger.sync_prompt("Twice upon a time"), Cause.REWRITE)


def test_completions_id_prompts_extend_the_ids_recorded() -> None:
    ledger = Ledger()
    assert ledger.sync_prompt([5, 6]) == [5, 6]
    ledger.commit(turn(None, [5, 6], [7, 8], surface="completions"), "v1")
    assert ledger.sync_prompt([5, 6, 7, 8, 9]) == [9]
    assert ledger.sync_prompt([5, 6, 7, 8]) == []
    violation(ledger.sync_prompt([5, 6, 7]), Cause.REWRITE)  # shorter than what was recorded
    violation(ledger.sync_prompt([5, 6, 7, 0, 9]), Cause.REWRITE)  # same length, other ids


def test_switching_between_chat_and_completions_is_a_mode_switch() -> None:
    chat = Ledger()
    chat.commit(turn([USER], [1], [2], content="Sunny."), "v1")
    violation(chat.sync_prompt("anything"), Cause.MODE_SWITCH)
    completions = Ledger()
    completions.commit(turn(None, [1], [2], surface="completions"), "v1")
    violation(completions.sync([USER]), Cause.MODE_SWITCH)
    assert not isinstance(completions.sync([USER], surface="completions"), Violation)


# -- tools and signatures -----------------------------------------------------------------------


def test_a_changed_tool_list_is_a_violation_after_the_first_turn_only() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    same = [{"function": {"parameters": {"type": "object"}, "name": "get_weather"}, "type": "function"}]
    digest = tools_digest(tools)
    assert isinstance(digest, int) and digest == tools_digest(same) != 0
    other = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    assert tools_digest(other) != digest
    assert tools_digest(None) == tools_digest([]) == 0
    ledger = Ledger()
    assert not isinstance(ledger.sync([USER], tools=digest), Violation)  # no turn yet: any tools
    ledger.commit(turn([USER], [1], [2], content="ok", tools=digest), "v1")
    echoed = [USER, {"role": "assistant", "content": "ok"}]
    assert not isinstance(ledger.sync(echoed, tools=tools_digest(same)), Violation)
    violation(ledger.sync(echoed, tools=0), Cause.TOOLS_CHANGED)


def test_signatures_follow_what_the_template_renders_not_the_spelling() -> None:
    base = {"role": "user", "content": "hi there"}
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}
    assert content_text(parts["content"]) == "hi\nthere"
    assert (
        content_text(None) == "" and content_text(["a", {"text": "b"}]) == "a\nb" and content_text(3) == "3"
    )
    assert message_digest(base) == message_digest({**base, "name": None, "tool_call_id": ""})
    assert message_digest({"role": "assistant", "content": None}) == message_digest(
        {"role": "assistant", "content": ""}
    )
    for changed in (
        {**base, "content": "hi  there"},
        {**base, "role": "system"},
        {**base, "name": "bob"},
        {"role": "tool", "content": "hi there", "tool_call_id": "x"},
    ):
        assert message_digest(changed) != message_digest(base), changed
    one = {"role": "assistant", "content": None, "tool_calls": [call(ID_A, '{"a": 1, "b": [2]}')]}
    spaced = {"role": "assistant", "content": None, "tool_calls": [call(ID_A, '{ "b": [2],  "a": 1 }')]}
    other = {"role": "assistant", "content": None, "tool_calls": [call(ID_A, '{"a": 2, "b": [2]}')]}
    assert message_digest(one) == message_digest(spaced) != message_digest(other)
    # Calls that are not objects are compared as they are.
    odd = {"role": "assistant", "content": None, "tool_calls": ["x"]}
    assert message_digest(odd) != message_digest({**odd, "tool_calls": ["y"]})
    assert canonical_arguments('{"b": 1, "a": 2}') == canonical_arguments({"a": 2, "b": 1}) == '{"a":2,"b":1}'
    assert canonical_arguments("not json {") == "not json {"


# -- echo rules ---------------------------------------------------------------------------------


@pytest.fixture
def called() -> Ledger:
    """One generated turn that minted two calls (ID_A, ID_B) and said a few words first."""
    ledger = Ledger()
    calls = (("get_weather", canonical_arguments('{"city": "Paris"}')), ("get_time", '{"tz":"CET"}'))
    ledger.commit(
        turn([USER], [1, 2], [3, 4, 5], tool_call_ids=(ID_A, ID_B), calls=calls, content="Let me see."), "v1"
    )
    return ledger


def echo(content: Any, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return [USER, message]


def test_echo_with_the_calls_as_served_records_no_edit(called: Ledger) -> None:
    got = called.sync(
        echo("Let me see.", call(ID_B, '{"tz": "CET"}', "get_time"), call(ID_A, '{"city":"Paris"}'))
    )
    assert not isinstance(got, Violation)
    assert got.new == [] and got.echo_matches == [] and got.echo_edits == []


def test_echo_edits_are_recorded_but_keep_the_sampled_tokens(called: Ledger) -> None:
    got = called.sync(
        echo(
            "I changed this.",
            call(ID_A, '{"city": "Rome"}', "get_weather"),
            call(ID_B, '{"tz":"CET"}', "get_date"),
        )
    )
    assert not isinstance(got, Violation)
    assert sorted(got.echo_edits) == [(0, "content"), (0, "tool_calls.arguments"), (0, "tool_calls.name")]


def test_a_text_echo_must_name_exactly_the_minted_ids(called: Ledger) -> None:
    got = called.sync(echo(f"Calling tools: [{ID_A}, {ID_B}]"))
    assert not isinstance(got, Violation) and got.echo_matches == [(0, "ids_in_text")]
    violation(called.sync(echo(f"Calling tools: [{ID_A}]")), Cause.REWRITE, 1)
    extra = "call_" + "c" * 24
    violation(called.sync(echo(f"Calling tools: [{ID_A}, {ID_B}, {extra}]")), Cause.REWRITE, 1)
    violation(called.sync(echo("Let me see.")), Cause.REWRITE, 1)


def test_calls_echoed_without_ids_match_by_names_and_arguments(called: Ledger) -> None:
    paris = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    cet = {"type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}
    rome = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    # Gemini's functionCall parts need no ids: any order, arguments as JSON values; the text may
    # differ (recorded as an edit).
    got = called.sync(echo("Other text.", cet, paris))
    assert not isinstance(got, Violation)
    assert got.echo_matches == [(0, "calls")] and got.echo_edits == [(0, "content")]
    violation(called.sync(echo("", rome, cet)), Cause.REWRITE, 1)  # other arguments
    violation(called.sync(echo("", paris)), Cause.REWRITE, 1)  # a call missing
    violation(called.sync(echo("", paris, call(ID_B, '{"tz": "CET"}', "get_time"))), Cause.REWRITE, 1)


def test_a_plain_answer_echo_matches_by_content_and_nothing_else() -> None:
    ledger = Ledger()
    ledger.commit(turn([USER], [1], [2, 3], content="  It is sunny. "), "v1")
    assert not isinstance(ledger.sync(echo("It is sunny.")), Violation)
    violation(ledger.sync(echo("It is rainy.")), Cause.REWRITE, 1)
    violation(ledger.sync(echo("It is sunny.", call(ID_A))), Cause.REWRITE, 1)
    violation(ledger.sync([USER, {"role": "user", "content": "It is sunny."}]), Cause.REWRITE, 1)
    violation(ledger.sync([USER, "It is sunny."]), Cause.REWRITE, 1)
    violation(ledger.sync([USER]), Cause.TRUNCATION, 1)


# -- retries, rollback, segments ----------------------------------------------------------------


def test_a_retry_is_only_the_exact_last_request_and_rollback_restores_everything() -> None:
    ledger = Ledger()
    assert not ledger.is_retry([USER])  # no turn yet
    ledger.commit(turn([USER], [1, 2], [3, 4], content="Sunny.", version_spans=[("v1", 0, 2)]), "v1")
    snapshot = (list(ledger.current.ids), list(ledger.current.mask), len(ledger.current.records))
    follow = [USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Sure?"}]
    ledger.commit(turn(follow[2:], [5, 6], [7, 8], content="Yes.", version_spans=[("v2", 0, 2)]), "v2")
    assert ledger.is_retry(follow)
    assert not ledger.is_retry(follow[:2])  # a different length
    assert not ledger.is_retry([*follow[:2], {"role": "user", "content": "Really?"}])
    assert len(ledger.current.records) == 4  # asking changed nothing
    last = ledger.rollback_last_turn()
    assert last.content == "Yes."
    seg = ledger.current
    assert (list(seg.ids), list(seg.mask), len(seg.records)) == snapshot
    assert len(seg.logprobs) == len(seg.ids) and seg.versions == [["v1", 2, 4]]
    assert ledger.is_retry([USER])


def test_new_segment_reuses_an_empty_one_and_passthrough_keeps_the_first_reason() -> None:
    ledger = Ledger()
    first = ledger.new_segment(Cause.REWRITE, "why")
    assert len(ledger.segments) == 1 and (first.cause, first.detail) == (Cause.REWRITE, "why")
    ledger.commit(turn([USER], [1], [2], content="a"), "v1")
    second = ledger.new_segment(Cause.TRUNCATION, "shrank")
    assert len(ledger.segments) == 2 and ledger.current is second and second.cause == Cause.TRUNCATION
    assert ledger.capturing
    ledger.invalidate("first")
    ledger.invalidate("second")
    assert not ledger.capturing and ledger.invalid_reason == "first"


def test_commit_refuses_logprobs_that_do_not_match_the_output() -> None:
    ledger = Ledger()
    with pytest.raises(ValueError, match="2 output ids but 1 logprobs"):
        ledger.commit(turn([USER], [1], [2, 3], logprobs=[-0.1]), "v1")
    assert len(ledger.current) == 0


# -- samples ------------------------------------------------------------------------------------


def two_turns(last_finish: str = "stop") -> Ledger:
    """Prompt [1, 2]; turn 1 samples [3, 4] on v1 then v2; an observation [5]; turn 2 samples [6] on v2."""
    ledger = Ledger()
    first = turn([USER], [1, 2], [3, 4], content="a", version_spans=[("v1", 0, 1), ("v2", 1, 2)], rid="r1")
    ledger.commit(first, "ignored")
    errors = [{"error": "bad json", "text": "{"}]
    history = [USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    second = turn(history[2:], [5], [6], content="c", rid="r2", finish_type=last_finish, parse_errors=errors)
    ledger.commit(second, "v2")
    return ledger


def test_samples_tile_versions_and_carry_their_metadata() -> None:
    ledger = two_turns()
    ledger.current.note("echo_edits", [0, "content"])
    ledger.current.note("echo_edits", [0, "content"])  # noted once
    [(index, sample, why)] = ledger.build_samples(
        reward=0.5, status=None, rollout_id="roll", group_index=2, metadata={"task": "t"}
    )
    assert (index, why) == (0, "") and sample is not None
    validate_sample(sample)
    assert sample.tokens.tolist() == [1, 2, 3, 4, 5, 6] and sample.response_length == 4
    assert sample.loss_mask.tolist() == [1, 1, 0, 1]
    assert sample.rollout_log_probs.tolist() == [-0.25, -0.25, 0.0, -0.25]
    # The observation [5] takes the version before it; adjacent v2 stretches merge.
    assert sample.weight_versions == [VersionSpan("v1", 0, 1), VersionSpan("v2", 1, 4)]
    assert (sample.reward, sample.rollout_id, sample.group_index) == (0.5, "roll", 2)
    assert sample.status is SampleStatus.COMPLETED
    meta = sample.metadata
    assert meta["task"] == "t" and meta["segment"] == 0 and meta["segments"] == 1
    assert meta["segment_cause"] == Cause.START and meta["engine_rids"] == ["r1", "r2"]
    assert meta["turn_finish"] == ["stop", "stop"] and meta["response_ids"] == ["chatcmpl-1"] * 2
    assert meta["tool_parse_errors"] == [{"turn": 1, "error": "bad json", "text": "{"}]
    assert meta["echo_edits"] == [[0, "content"]]
    assert ledger.current.trainable_tokens() == 3


def test_sample_status_follows_the_last_turn_unless_given() -> None:
    cut = two_turns(last_finish="length")
    [(_, sample, _)] = cut.build_samples(reward=None, status=None, rollout_id="r", group_index=0, metadata={})
    assert sample is not None and sample.status is SampleStatus.TRUNCATED
    [(_, sample, _)] = cut.build_samples(
        reward=None, status=SampleStatus.ABORTED, rollout_id="r", group_index=0, metadata={}
    )
    assert sample is not None and sample.status is SampleStatus.ABORTED


def test_each_segment_is_its_own_sample_and_empty_ones_say_why() -> None:
    ledger = two_turns()
    ledger.new_segment(Cause.REWRITE, "history rewritten")
    ledger.commit(turn([USER], [7], [8, 9], content="x"), "v3")
    ledger.new_segment(Cause.TRUNCATION)
    out = ledger.build_samples(reward=1.0, status=None, rollout_id="r", group_index=0, metadata={})
    assert [(i, s is None, why) for i, s, why in out] == [
        (0, False, ""),
        (1, False, ""),
        (2, True, "segment has no generated turn"),
    ]
    second = out[1][1]
    assert second is not None and second.tokens.tolist() == [7, 8, 9] and second.response_length == 2
    assert second.metadata["segment_cause"] == Cause.REWRITE
    assert second.metadata["segment_cause_detail"] == "history rewritten"
    assert second.metadata["segments"] == 3 and "tool_parse_errors" not in second.metadata
    assert second.weight_versions == [VersionSpan("v3", 0, 2)]
    assert ledger.segments[2].ids_view().tolist() == [] and ledger.segments[2].last_turn is None
    assert np.array_equal(ledger.segments[1].ids_view(), np.asarray([7, 8, 9], dtype=np.int32))
