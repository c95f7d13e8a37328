"""The turn lifecycle (`gateway/turns/lifecycle.py`) in process: the scope's counters and lock, the policy's
decision, retry versus concurrent duplicates, the sampling parameters at the context boundary,
and what a commit does to the ledger, the session, the journal and the metrics.

Real parts: the tiny Qwen3 tokenizer and template render the prompts, the ledger is the real
one, and the journal is a real SQLite file that a second session replays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.engine_client.backend import GenerationResult
from rlgw.gateway.errors import Conflict, ContextLengthExceeded
from rlgw.gateway.ledger.ledger import Cause, Ledger, Policy, Violation, history_print
from rlgw.gateway.ledger.record import TurnRecord
from rlgw.gateway.metrics import REGISTRY
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.sessions.journal import SessionJournal
from rlgw.gateway.sessions.replay import apply_record
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.turns.lifecycle import (
    Outcome,
    Plan,
    Turn,
    commit,
    decide,
    duplicate_cause,
    engine_sampling,
    turn_scope,
)

CONTEXT = 64
USER = {"role": "user", "content": "What is two plus two?"}
REWRITE = Violation(Cause.REWRITE, 1, "history rewritten at message 1")


@pytest.fixture(scope="module")
def profile(tiny_qwen3: Path) -> ModelProfile:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    return ModelProfile("qwen3", tok, ChatRenderer(tok), CONTEXT, "hermes", True)


@pytest.fixture(scope="module")
def eot(profile: ModelProfile) -> int:
    return int(profile.tokenizer.convert_tokens_to_ids(profile.renderer.end_of_turn_text))


def _session(
    *, policy: Policy = Policy.SEGMENT, sampling: dict[str, Any] | None = None, **kw: Any
) -> Session:
    return Session("s1", "tenant-a", "task", Mode.CAPTURE, "r", 0, policy, {}, sampling or {}, **kw)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- turn_scope -------------------------------------------------------------------------------------


async def test_a_committed_turn_counts_once_and_releases_its_rid() -> None:
    sess = _session()
    async with turn_scope(sess, arrived=12.5) as turn:
        assert turn.arrived == 12.5 and turn.session is sess
        assert sess.active_rids == {turn.rid} and sess.lock.locked()
        turn.committed = True
    assert (sess.turns, sess.failed_turns, sess.active_rids) == (1, 0, set())
    assert not sess.lock.locked()
    async with turn_scope(sess) as second:
        assert second.rid != turn.rid
        assert isinstance(second.arrived, float) and second.arrived >= turn.arrived
        second.committed = True
    assert sess.turns == 2


async def test_an_uncommitted_turn_counts_as_failed_on_every_exit_path() -> None:
    sess = _session()
    with pytest.raises(RuntimeError, match="engine down"):
        async with turn_scope(sess) as turn:
            raise RuntimeError("engine down")
    assert (sess.turns, sess.failed_turns, sess.active_rids) == (0, 1, set())
    async with turn_scope(sess) as turn:  # left without committing (a client that went away)
        assert turn.rid in sess.active_rids
    assert (sess.turns, sess.failed_turns, sess.active_rids) == (0, 2, set())
    assert not sess.lock.locked()


@pytest.mark.parametrize("state", ["finished", "finishing"])
async def test_a_closed_session_refuses_a_turn_and_counts_nothing(state: str) -> None:
    sess = _session(**{state: True})
    with pytest.raises(Conflict) as err:
        async with turn_scope(sess):
            pytest.fail("a closed session ran a turn")
    assert err.value.status == 409 and err.value.code == "session_finished"
    assert (sess.turns, sess.failed_turns, sess.active_rids) == (0, 0, set())


async def test_a_turn_that_waited_on_the_lock_while_finish_began_is_refused() -> None:
    sess = _session()
    entered: list[str] = []

    async def second() -> None:
        async with turn_scope(sess) as turn:
            entered.append(turn.rid)

    async with turn_scope(sess) as first:
        waiting = asyncio.create_task(second())
        await asyncio.sleep(0.01)
        assert not entered, "a second turn ran while the first held the session"
        sess.finishing = True
        first.committed = True
    with pytest.raises(Conflict):
        await waiting
    assert not entered and (sess.turns, sess.failed_turns) == (1, 0)


# -- decide and duplicate_cause ---------------------------------------------------------------------------


def test_decide_follows_the_session_policy() -> None:
    with pytest.raises(Conflict) as err:
        decide(_session(policy=Policy.REFUSE), REWRITE, None)
    assert err.value.status == 409 and err.value.code == "history_rewritten"
    assert decide(_session(policy=Policy.PASSTHROUGH), REWRITE, "compaction") == str(REWRITE)
    assert decide(_session(), REWRITE, None) == (Cause.REWRITE, str(REWRITE))
    # The agent's stated cause names the segment.
    assert decide(_session(), REWRITE, "compaction") == ("compaction", str(REWRITE))


def test_a_duplicate_is_concurrent_only_if_it_arrived_before_the_last_commit() -> None:
    def at(arrived: float) -> Turn:
        return Turn(_session(), "rid", arrived)

    assert duplicate_cause(at(9.0), 10.0) == Cause.CONCURRENT
    assert duplicate_cause(at(10.0), 10.0) == Cause.RETRY
    assert duplicate_cause(at(11.0), 10.0) == Cause.RETRY


# -- engine_sampling ---------------------------------------------------------------------------------


def test_the_room_left_is_the_default_and_an_exact_fit_is_served(profile: ModelProfile) -> None:
    sp, overridden = engine_sampling(profile, _session(), {}, None, 0, CONTEXT - 5)
    assert sp == {"max_new_tokens": 5} and overridden == {}
    assert type(sp["max_new_tokens"]) is int
    sp, _ = engine_sampling(profile, _session(), {}, 5, 0, CONTEXT - 5)
    assert sp["max_new_tokens"] == 5
    sp, _ = engine_sampling(profile, _session(), {}, None, 0, CONTEXT - 1)
    assert sp["max_new_tokens"] == 1


@pytest.mark.parametrize("prompt_len", [CONTEXT, CONTEXT + 1])
def test_a_prompt_that_fills_the_context_is_refused(profile: ModelProfile, prompt_len: int) -> None:
    with pytest.raises(ContextLengthExceeded) as err:
        engine_sampling(profile, _session(), {}, 1, 0, prompt_len)
    assert err.value.param == "messages" and err.value.status == 400
    assert err.value.code == "context_length_exceeded"


def test_one_token_more_than_the_room_is_refused(profile: ModelProfile) -> None:
    with pytest.raises(ContextLengthExceeded) as err:
        engine_sampling(profile, _session(), {}, 6, 0, CONTEXT - 5)
    assert err.value.param == "max_tokens"
    # The session's max_tokens applies when the request has none, and is checked the same way.
    sess = _session(sampling={"max_tokens": 6, "temperature": 0.7})
    with pytest.raises(ContextLengthExceeded):
        engine_sampling(profile, sess, {}, None, 0, CONTEXT - 5)
    sp, _ = engine_sampling(profile, sess, {}, None, 0, CONTEXT - 6)
    assert sp == {"temperature": 0.7, "max_new_tokens": 6}
    # The request's max_tokens wins over the session's.
    sp, _ = engine_sampling(profile, sess, {}, 3, 0, CONTEXT - 5)
    assert sp["max_new_tokens"] == 3


def test_session_precedence_keeps_the_trainers_sampling(profile: ModelProfile) -> None:
    sess = _session(sampling={"temperature": 1.0, "top_p": 0.95, "max_tokens": 8})
    requested = {"temperature": 0.2, "sampling_seed": 7, "stop": ["\n"], "frequency_penalty": 0.5}
    sp, overridden = engine_sampling(profile, sess, requested, None, 3, 10)
    assert sp == {
        "temperature": 1.0,
        "top_p": 0.95,
        "stop": ["\n"],
        "frequency_penalty": 0.5,
        "max_new_tokens": 8,
        "top_logprobs_num": 3,
    }
    assert overridden == {"temperature": 0.2, "sampling_seed": 7}
    assert sess.sampling == {"temperature": 1.0, "top_p": 0.95, "max_tokens": 8}, "the session is unchanged"


def test_request_precedence_applies_the_agents_sampling(profile: ModelProfile) -> None:
    sess = _session(sampling={"temperature": 1.0, "top_k": 20})
    sess.sampling_precedence = "request"
    sp, overridden = engine_sampling(profile, sess, {"temperature": 0.2, "top_p": 0.5}, 4, 0, 10)
    assert sp == {"temperature": 0.2, "top_k": 20, "top_p": 0.5, "max_new_tokens": 4}
    assert overridden == {}


# -- commit and apply_record -------------------------------------------------------------------------


def _plan(profile: ModelProfile, messages: list[dict[str, Any]], **kw: Any) -> Plan:
    ids = profile.renderer.render_prompt(messages, None)
    return Plan(
        np.asarray(ids, dtype=np.int32), list(ids), True, messages, history=history_print(messages), **kw
    )


def _result(output_ids: list[int], finish: str = "stop", rid: str = "rid-1", **kw: Any) -> GenerationResult:
    lps = [-0.25 * (i + 1) for i in range(len(output_ids))]
    return GenerationResult(rid, output_ids, lps, {"type": finish}, "v7", 0, **kw)


async def _commit(
    profile: ModelProfile,
    sess: Session,
    plan: Plan,
    result: GenerationResult,
    eot: int | None,
    *,
    overridden: dict[str, Any] | None = None,
    calls: tuple[tuple[str, str], ...] = (),
    call_ids: tuple[str, ...] = (),
) -> Turn:
    async with turn_scope(sess) as turn:
        outcome = Outcome(
            response_id="chatcmpl-" + result.rid,
            content="4",
            overridden=overridden or {},
            call_ids=list(call_ids),
            calls=calls,
            end_of_turn_id=eot,
        )
        await commit(profile, turn, plan, result, outcome)
    return turn


async def test_a_commit_appends_the_increment_then_the_sampled_ids(profile: ModelProfile, eot: int) -> None:
    sess = _session(ledger=Ledger())
    plan = _plan(profile, [USER], surface="chat", tools=17)
    out = [19, 20, eot]
    turn = await _commit(profile, sess, plan, _result(out), eot)
    assert turn.committed and (sess.turns, sess.failed_turns) == (1, 0)
    seg = sess.ledger.current
    n = len(plan.increment)
    assert list(seg.ids) == plan.increment + out
    assert list(seg.mask) == [0] * n + [1] * 3
    assert list(seg.logprobs)[n:] == [-0.25, -0.5, -0.75]
    assert seg.versions == [["v7", n, n + 3]]
    assert (seg.surface, seg.tools, seg.cause) == ("chat", 17, Cause.START)
    [gen] = seg.turns
    assert (gen.rid, gen.response_id, gen.content, gen.finish_type) == (
        "rid-1",
        "chatcmpl-rid-1",
        "4",
        "stop",
    )
    assert gen.ended_with_stop_token and gen.committed_at > 0
    assert sess.termination_reason is None and seg.notes == {}


@pytest.mark.parametrize(
    ("out", "closed"),
    [([19, 20, "eot"], True), (["eot", 20], False), ([19, 20], False), ([], False)],
)
async def test_a_turn_is_closed_only_when_its_last_id_is_the_end_of_turn(
    profile: ModelProfile, eot: int, out: list[Any], closed: bool
) -> None:
    ids = [eot if i == "eot" else i for i in out]
    sess = _session(ledger=Ledger())
    await _commit(profile, sess, _plan(profile, [USER]), _result(ids), eot)
    assert sess.ledger.current.turns[0].ended_with_stop_token is closed


@pytest.mark.parametrize(
    ("n_out", "finish", "exhausted"),
    [(0, "length", True), (-1, "length", False), (0, "stop", False), (1, "length", True)],
)
async def test_a_generation_that_fills_the_context_ends_the_episode(
    profile: ModelProfile, n_out: int, finish: str, exhausted: bool
) -> None:
    """`n_out` is relative to the room the prompt leaves (0: the generation ends at the context)."""
    sess = _session(ledger=Ledger())
    plan = _plan(profile, [USER])
    room = CONTEXT - len(plan.input_ids)
    await _commit(profile, sess, plan, _result([21] * (room + n_out), finish), None)
    assert (sess.termination_reason == "context_length_exceeded") is exhausted
    assert len(sess.ledger.current.turns) == 1


async def test_an_unrecorded_turn_leaves_the_ledger_and_still_counts(profile: ModelProfile) -> None:
    sess = _session(ledger=Ledger())
    plan = _plan(profile, [USER])
    plan.recorded = False  # an eval-mode turn
    generated = _metric("rlgw_generated_tokens_total")
    recorded = _metric("rlgw_recorded_tokens_total")
    await _commit(profile, sess, plan, _result([5, 6, 7]), None)
    assert len(sess.ledger.current) == 0 and sess.turns == 1
    assert _metric("rlgw_generated_tokens_total") - generated == 3
    assert _metric("rlgw_recorded_tokens_total") == recorded


async def test_a_recorded_turn_counts_its_tokens(profile: ModelProfile, eot: int) -> None:
    sess = _session(ledger=Ledger())
    plan = _plan(profile, [USER])
    before = [_metric(f"rlgw_{k}_tokens_total") for k in ("generated", "recorded", "trainable")]
    await _commit(profile, sess, plan, _result([5, 6, eot]), eot)
    after = [_metric(f"rlgw_{k}_tokens_total") for k in ("generated", "recorded", "trainable")]
    assert [b - a for a, b in zip(before, after, strict=True)] == [3, len(plan.increment) + 3, 3]


async def test_a_session_without_a_ledger_commits_its_counters_only(
    profile: ModelProfile, tmp_path: Path
) -> None:
    journal = SessionJournal.open(tmp_path)
    try:
        sess = _session(journal=journal)
        plan = _plan(profile, [USER])
        room = CONTEXT - len(plan.input_ids)
        await _commit(profile, sess, plan, _result([5] * room, "length"), None)
        assert sess.turns == 1 and sess.termination_reason == "context_length_exceeded"
        # Nothing to restore, so nothing is journaled.
        assert list(journal.turns_dir.iterdir()) == []
    finally:
        journal.close()


async def test_passthrough_turns_capture_off_and_records_nothing(profile: ModelProfile) -> None:
    sess = _session(ledger=Ledger(), policy=Policy.PASSTHROUGH)
    await _commit(profile, sess, _plan(profile, [USER]), _result([5, 6]), None)
    follow = [USER, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    plan = _plan(profile, follow, invalidate="history rewritten at message 0")
    await _commit(profile, sess, plan, _result([8, 9]), None)
    ledger = sess.ledger
    assert ledger.invalid_reason == "history rewritten at message 0" and not ledger.capturing
    assert len(ledger.current.turns) == 1 and sess.turns == 2
    await _commit(profile, sess, _plan(profile, follow), _result([10]), None)
    assert len(ledger.current.turns) == 1, "no turn is recorded once capture is off"


async def test_a_segment_change_opens_a_new_segment_and_is_counted(profile: ModelProfile, eot: int) -> None:
    sess = _session(ledger=Ledger())
    await _commit(profile, sess, _plan(profile, [USER]), _result([5, eot]), eot)
    before = _metric("rlgw_segments_total", cause="compaction")
    plan = _plan(
        profile, [{"role": "user", "content": "Summary: 2+2=4"}], segment=("compaction", "agent said")
    )
    await _commit(profile, sess, plan, _result([6, eot], rid="rid-2"), eot)
    first, second = sess.ledger.segments
    assert (second.cause, second.detail) == ("compaction", "agent said")
    assert [t.rid for t in first.turns] == ["rid-1"] and [t.rid for t in second.turns] == ["rid-2"]
    assert _metric("rlgw_segments_total", cause="compaction") - before == 1


async def test_a_retry_replaces_the_last_turn_and_notes_it(profile: ModelProfile, eot: int) -> None:
    sess = _session(ledger=Ledger())
    plan = _plan(profile, [USER])
    await _commit(profile, sess, plan, _result([5, 6, eot]), eot)
    retry = _plan(profile, [USER], replace_last=True)
    await _commit(profile, sess, retry, _result([7, eot], rid="rid-2"), eot)
    seg = sess.ledger.current
    assert list(seg.ids) == [*plan.increment, 7, eot] and [t.rid for t in seg.turns] == ["rid-2"]
    assert seg.notes == {"replaced_turns": [{"turn": 0, "rid": "rid-1", "response_id": "chatcmpl-rid-1"}]}


async def test_echo_notes_and_overridden_sampling_reach_the_segment(profile: ModelProfile, eot: int) -> None:
    sess = _session(ledger=Ledger())
    await _commit(profile, sess, _plan(profile, [USER]), _result([5, eot]), eot)
    plan = _plan(profile, [{"role": "user", "content": "again"}])
    plan.echo_matches, plan.echo_edits = [(0, "ids_in_text")], [(0, "content")]
    await _commit(profile, sess, plan, _result([6, eot], rid="rid-2"), eot, overridden={"temperature": 0.3})
    assert sess.ledger.current.notes == {
        "echo_matches": [{"turn": 0, "how": "ids_in_text"}],
        "echo_edits": [{"turn": 0, "field": "content"}],
        "agent_sampling": [{"turn": 1, "temperature": 0.3}],
    }


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[SessionJournal]:
    j = SessionJournal.open(tmp_path)
    yield j
    j.close()


async def test_the_journal_replays_to_the_same_ledger(
    profile: ModelProfile, eot: int, journal: SessionJournal
) -> None:
    """Every turn is journaled before it is applied; replaying the rows rebuilds the ledger."""
    sess = _session(ledger=Ledger(), journal=journal)
    await journal.opened(sess.id, sess.settings(), b"k")
    calls = (("add", '{"a":2,"b":2}'),)
    await _commit(
        profile, sess, _plan(profile, [USER]), _result([5, eot]), eot, calls=calls, call_ids=("call_1",)
    )
    plan = _plan(profile, [{"role": "user", "content": "b"}], segment=("rewrite", "message 0 changed"))
    plan.echo_matches = [(0, "ids_in_text")]
    spans = [("v7", 0, 1), ("v8", 1, 2)]
    await _commit(profile, sess, plan, _result([6, 7], "length"), eot, overridden={"top_p": 0.1})
    retry = _plan(profile, [USER], replace_last=True)
    await _commit(profile, sess, retry, _result([8, eot], rid="r3", version_spans=spans), eot)

    rows = journal.load(sess.id)
    assert rows is not None and len(rows.turns) == 3
    replayed = _session(ledger=Ledger())
    for record in rows.turns:
        apply_record(replayed, TurnRecord.from_journal(record))
    for live, again in zip(sess.ledger.segments, replayed.ledger.segments, strict=True):
        assert (live.cause, live.detail, live.notes, live.versions) == (
            again.cause,
            again.detail,
            again.notes,
            again.versions,
        )
        assert (list(live.ids), bytes(live.mask), list(live.logprobs)) == (
            list(again.ids),
            bytes(again.mask),
            list(again.logprobs),
        )
        # The journal keeps the new messages' digests and the request's print, not the messages.
        assert live.records == again.records and live.history == again.history
        for a, b in zip(live.turns, again.turns, strict=True):
            assert (a.rid, a.tool_call_ids, a.calls, a.ended_with_stop_token) == (
                b.rid,
                b.tool_call_ids,
                b.calls,
                b.ended_with_stop_token,
            )
            assert a.committed_at > 0 and b.committed_at == 0.0  # replay has no live clock
    assert sess.ledger.segments[0].history == history_print([USER])
    assert [r.role for r in sess.ledger.segments[0].records] == ["user", "assistant"]
    first = sess.ledger.segments[0].turns[0]
    assert first.tool_call_ids == ("call_1",) and first.calls == (("add", '{"a":2,"b":2}'),)
    n = sess.ledger.segments[1].turns[0].start
    assert sess.ledger.segments[1].versions == [["v7", n, n + 1], ["v8", n + 1, n + 2]]


async def test_a_turn_whose_journal_write_fails_changes_nothing(
    profile: ModelProfile, eot: int, tmp_path: Path
) -> None:
    journal = SessionJournal.open(tmp_path)
    journal.close()  # every write now fails
    sess = _session(ledger=Ledger(), journal=journal)
    with pytest.raises(Exception, match="closed"):
        await _commit(profile, sess, _plan(profile, [USER]), _result([5, eot]), eot)
    assert len(sess.ledger.current) == 0 and (sess.turns, sess.failed_turns) == (0, 1)


async def test_a_completions_turn_records_text_and_no_messages(profile: ModelProfile) -> None:
    ids = profile.tokenizer.encode("Once upon a time", add_special_tokens=False)
    plan = Plan(
        np.asarray(ids, dtype=np.int32), ids, True, None, "completions", agent_text="Once upon a time"
    )
    sess = _session(ledger=Ledger())
    await _commit(profile, sess, plan, _result([11, 12]), None)
    seg = sess.ledger.current
    assert (seg.surface, seg.text, seg.records, seg.history) == ("completions", "Once upon a time", [], None)
    assert list(seg.ids) == [*ids, 11, 12] and seg.turns[0].ended_with_stop_token is False
