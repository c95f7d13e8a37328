"""Conversations in a session (`gateway/ledger/ledger.py`'s `match`, `sessions/replay.py`): a main
agent and its subagents or side calls, interleaved on one session, each appended in place.

The first tests are on hand-made turns (no engine, no template). The last ones drive a real
`rlgw serve` in front of the embedded engine with the real `openai` client, and check every stored
sample token for token (`tests/support/e2e.py`'s `check_sample`: mask-1 tokens are the engine's
sampled ids and logprobs, each turn fed exactly the series before it; mask-0 tokens are the
template's own render), so a continued conversation that re-rendered its history, or
re-tokenized what the model generated, fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ledger.ledger import Cause, Ledger, Policy, Violation
from rlgw.gateway.ledger.record import TurnRecord
from rlgw.gateway.sessions.replay import apply_record
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.turns.messages import conversation_event
from tests.gateway.ledger.test_ledger import _commit

MAIN = {"role": "system", "content": "You are the main agent. Use tools."}
SUB = {"role": "system", "content": "You are a research subagent. Answer briefly."}
TITLE = {"role": "system", "content": "Generate a short title for the conversation."}
USER = {"role": "user", "content": "Weather in Paris?"}


def _turn(ledger: Ledger, messages: list[dict], out: list[int], rid: str, **kw: Any) -> int:
    """Match, then apply as the gateway does (open, focus, or a policy's segment); the conversation."""
    found = ledger.match(messages, **kw)
    if found.opens:
        ledger.open_conversation(ledger.active)
    else:
        ledger.focus(found.conversation)
        if isinstance(found.found, Violation):
            ledger.new_segment(found.found.cause)
    new = messages if isinstance(found.found, Violation) else found.found.new
    _commit(ledger, new, [1] * len(new), out, rid=rid, content=f"answer {rid}")
    return found.conversation


def _answer(rid: str) -> dict:
    return {"role": "assistant", "content": f"answer {rid}"}


def test_interleaved_conversations_each_append_in_place() -> None:
    ledger = Ledger()
    main = [MAIN, USER]
    assert _turn(ledger, main, [10, 11], "m1") == 0
    sub = [SUB, {"role": "user", "content": "Find the forecast."}]
    assert _turn(ledger, sub, [20], "s1") == 1
    for k in (2, 3):
        sub += [_answer(f"s{k - 1}"), {"role": "user", "content": "more"}]
        assert _turn(ledger, sub, [20 + k], f"s{k}") == 1
    main += [_answer("m1"), {"role": "user", "content": "and Berlin?"}]
    assert _turn(ledger, main, [12], "m2") == 0
    assert [s.cause for s in ledger.segments] == [Cause.START, Cause.NEW_CONVERSATION]
    assert [(c.index, c.parent, c.segments) for c in ledger.conversations] == [(0, None, [0]), (1, 0, [1])]
    # Each conversation's sampled ids stay where they were sampled: nothing re-rendered.
    main_seg, sub_seg = ledger.segments
    assert main_seg.ids.tolist() == [1, 1, 10, 11, 1, 12]  # the echo of m1 is not rendered again
    assert [t.rid for t in main_seg.turns] == ["m1", "m2"]
    assert [t.rid for t in sub_seg.turns] == ["s1", "s2", "s3"]
    built = ledger.build_samples(reward=1.0, status=None, rollout_id="r", group_index=0, metadata={})
    meta = [(s.metadata["conversation"], s.metadata["conversation_parent"]) for _, s, _ in built]
    assert meta == [(0, None), (1, 0)]
    assert {s.rollout_id for _, s, _ in built} == {"r"}


def test_a_rewrite_keeping_the_system_prompt_stays_in_its_conversation() -> None:
    ledger = Ledger()
    _turn(ledger, [MAIN, USER], [10], "m1")
    _turn(ledger, [SUB, USER], [20], "s1")
    # A compaction of the main conversation: its system prompt, then a summary.
    compacted = [MAIN, {"role": "user", "content": "Summary: Paris is sunny."}, _answer("x"), USER]
    assert _turn(ledger, compacted, [11], "m2") == 0
    assert [(s.cause, s.conversation) for s in ledger.segments] == [
        (Cause.START, 0),
        (Cause.NEW_CONVERSATION, 1),
        (Cause.REWRITE, 0),
    ]
    assert ledger.conversations[0].segments == [0, 2]


def test_without_a_system_prompt_a_new_first_message_is_a_violation_unless_the_agent_says_so() -> None:
    ledger = Ledger()
    _turn(ledger, [USER], [10], "a")
    other = [{"role": "user", "content": "Something else"}]
    found = ledger.match(other)
    assert not found.opens and found.found.cause == Cause.TRUNCATION
    found = ledger.match(other, new_on_miss=True)
    assert found.opens and found.conversation == 1


def test_the_conversation_event_names_a_new_one_and_its_parent() -> None:
    assert conversation_event(None, 2) == (None, None, None)
    assert conversation_event("compaction", 2) == (False, None, "compaction")
    assert conversation_event("new_conversation", 2) == (True, None, None)
    assert conversation_event("new_conversation; parent=1", 2) == (True, 1, None)
    for bad in ("new_conversation; parent=2", "new_conversation; parent=x", "new_conversation; mother=0"):
        with pytest.raises(InvalidRequest):
            conversation_event(bad, 2)


def _record(conversation: int | None, segment: Any, out: list[int], **extra: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": "v1",
        "segment": segment,
        "commit": {
            "new_messages": None,
            "records": [["user", 1]],
            "prompt_ids": [1],
            "output_ids": out,
            "logprobs": [-0.5] * len(out),
            "version_spans": [],
            "response_id": "x",
            "tool_call_ids": [],
            "content": "",
            "rid": "r",
            "finish_type": "stop",
            "ended_with_stop_token": True,
            "parse_errors": [],
            "calls": [],
        },
        **extra,
    }
    if conversation is not None:
        record["conversation"] = conversation
    return record


def _session() -> Session:
    return Session("s-x", "t", "task", Mode.CAPTURE, "r", 0, Policy.SEGMENT, {}, {}, ledger=Ledger())


def test_replayed_records_rebuild_the_conversations_and_old_records_still_apply() -> None:
    s = _session()
    apply_record(s, TurnRecord.from_journal(_record(0, None, [10])))
    apply_record(s, TurnRecord.from_journal(_record(1, ["new_conversation", "d"], [20], parent=0)))
    apply_record(s, TurnRecord.from_journal(_record(0, None, [11])))
    apply_record(s, TurnRecord.from_journal(_record(1, None, [21])))
    assert [(c.parent, c.segments) for c in s.ledger.conversations] == [(None, [0]), (0, [1])]
    assert [s.ledger.segments[0].ids.tolist(), s.ledger.segments[1].ids.tolist()] == [
        [1, 10, 1, 11],
        [1, 20, 1, 21],
    ]
    # A journal written before conversations: no `conversation` key, one line of segments.
    old = _session()
    apply_record(old, TurnRecord.from_journal(_record(None, None, [10])))
    apply_record(old, TurnRecord.from_journal(_record(None, ["truncation", "d"], [11])))
    assert len(old.ledger.conversations) == 1 and old.ledger.conversations[0].segments == [0, 1]
