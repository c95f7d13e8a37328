"""One turn's lifecycle, the same for every API surface, streamed or not.

A surface (Chat Completions, Completions, Anthropic Messages, OpenAI Responses) is a thin
translation: it validates its request, builds a `Plan` (what the engine is fed and what the
ledger will record), and runs the engine call inside `turn_scope`. The scope owns everything
a turn must do the same way everywhere:

- the session lock (one turn at a time per session), held for the whole turn, a stream's
  body included, and released on every exit path;
- the check that the session is still open (a turn that waited on the lock while `finish`
  ran is refused with 409, never served unrecorded);
- the engine request id, registered so `finish`/`delete` can abort it;
- the counters: `turns` rises when a turn commits, `failed_turns` on any other exit
  (an error, an engine abort, a client that disconnected mid-stream);
- the commit: the policy's segment change, a replaced retry, the prompt increment and the
  sampled ids are applied together, only after the engine answered (`commit`), so a turn
  that fails leaves the ledger and the session exactly as they were;
- the settling: a committed turn is journaled before it is answered, but applying its record
  to the ledger, its counters and the lock's release can wait until the answer is sent. Inside
  `settle_after_reply` (the edge wraps each turn request in it) they do: the agent does not
  wait for that bookkeeping, and the session stays locked until it is done, so the next turn,
  a `finish` or a retry still sees the turn applied.

Policies are decided while planning (`decide`) but act only at commit. This module knows the
ledger and the session; it knows nothing about request or response shapes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlgw.gateway import metrics
from rlgw.gateway.engine_client.backend import GenerationResult, new_rid
from rlgw.gateway.errors import Conflict, ContextLengthExceeded, SessionMoved
from rlgw.gateway.ids import derived_seed
from rlgw.gateway.ledger.ledger import (
    Cause,
    Policy,
    TurnCommit,
    Violation,
    check_sampled,
    message_digest,
    routed_from,
)
from rlgw.gateway.ledger.record import TurnRecord
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.sample import compact_routing
from rlgw.gateway.sessions.replay import apply_record
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.tenancy.limits import turn_generated, turn_slot

log = logging.getLogger(__name__)

# The output cap of a turn that names none (`rlgw serve --default-max-tokens`).
DEFAULT_MAX_TOKENS = 16384
# Sampling keys the trainer owns in a session whose sampling precedence is `session`.
OWNED_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "sampling_seed")


@dataclass(slots=True)
class Plan:
    """What a turn feeds the engine and, if it commits, what it does to the ledger."""

    input_ids: np.ndarray
    increment: list[int] | np.ndarray  # int32 when the turn built input_ids from it
    recorded: bool  # False: eval mode, or capture turned off (passthrough)
    new_messages: list[dict[str, Any]] | None = None  # None: a completions turn (no messages)
    surface: str = "chat"
    tools: int = 0  # tools_digest of the request
    segment: tuple[str, str] | None = None  # (cause, detail): open a new segment first
    invalidate: str | None = None  # passthrough: turn capture off (this turn is not recorded)
    replace_last: bool = False  # a client retry: this turn replaces the last one
    echo_matches: list[tuple[int, str]] = field(default_factory=list)
    echo_edits: list[tuple[int, str]] = field(default_factory=list)
    agent_text: str = ""  # completions: the prompt text this turn adds
    reasoning_forced: bool = False  # the generation prompt already opened a think block
    history: tuple[int, int, int] | None = None  # the request's `ledger.history_print`
    records: list[tuple[str, int]] | None = None  # `new_records`, once computed
    # The conversation the turn appends to (None: the active one, as for completions); a plan
    # that opens one names its index (the next) and its `parent`, with `segment` new_conversation.
    conversation: int | None = None
    parent: int | None = None


def routed_start(profile: ModelProfile, plan: Plan) -> int | None:
    """Where the engine's routed experts for this turn should start (None: do not ask).

    Asked on every recorded turn of a MoE model, for the positions the segment has no routing for
    yet (`ledger.routed_from`): what the trainer replays, prompt and tool tokens included, at the
    cost of one increment's rows per turn and no re-sent history.
    """
    if profile.routing is None or not plan.recorded:
        return None
    return routed_from(len(plan.input_ids), len(plan.increment))


def turn_routing(profile: ModelProfile, plan: Plan, result: GenerationResult) -> np.ndarray | None:
    """The turn's routed experts as the ledger keeps them: [rows, layers, top_k], uint8 up to 256
    experts (`compact_routing`). None when the engine sent none or a count that does not fit."""
    shape, flat = profile.routing, result.routed_experts
    if shape is None or flat is None:
        return None
    start = routed_start(profile, plan) or 0
    rows = len(plan.input_ids) + len(result.output_ids) - 1 - start
    if rows < 0 or flat.size != rows * shape.layers * shape.top_k:
        return None
    return compact_routing(flat.reshape(rows, shape.layers, shape.top_k))


def new_records(plan: Plan) -> list[tuple[str, int]] | None:
    """(role, message digest) of the plan's new messages, computed once (None: a completions turn)."""
    if plan.new_messages is None:
        return None
    if plan.records is None:
        plan.records = [(m.get("role", ""), message_digest(m)) for m in plan.new_messages]
    return plan.records


@dataclass(slots=True)
class Turn:
    """One running turn: its engine request id, when its request arrived, and once it is
    committed (journaled), the record still to apply and when it was committed."""

    session: Session
    rid: str
    arrived: float
    committed: bool = False
    record: TurnRecord | None = None
    committed_at: float = 0.0
    generated: int = 0  # sampled ids, counted against the tenant when the turn settles
    surface: str = "chat"


class _Unsettled:
    """The committed turns of one request that settle when it ends (`settle_after_reply`)."""

    __slots__ = ("open", "turns")

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.open = True  # closed once settled: a later turn (in a copied context) settles at once

    def settle(self, session: Session | None = None) -> None:
        """Settle the turns held (of `session` only, if given), in the order they committed."""
        keep = []
        for turn in self.turns:
            if session is None or turn.session is session:
                _settle(turn)
            else:
                keep.append(turn)
        self.turns = keep


_UNSETTLED: contextvars.ContextVar[_Unsettled | None] = contextvars.ContextVar(
    "rlgw_unsettled_turns", default=None
)


@contextlib.contextmanager
def settle_after_reply() -> Iterator[None]:
    """Within this block, committed turns settle (record applied, counters, lock released) when
    the block ends, not when their scope does: wrapped around a request, reply included, the
    agent gets its answer before that work runs. A settlement never raises."""
    unsettled = _Unsettled()
    token = _UNSETTLED.set(unsettled)
    try:
        yield
    finally:
        _UNSETTLED.reset(token)
        unsettled.open = False
        unsettled.settle()


@contextlib.asynccontextmanager
async def turn_scope(session: Session, *, arrived: float | None = None) -> AsyncIterator[Turn]:
    """Hold the session for one turn; see the module docstring for what it owns."""
    arrived = time.monotonic() if arrived is None else arrived
    # The tenant's in-flight slot (429 over a limit) is held while waiting for the lock too.
    with turn_slot(session.tenant, session.id), metrics.TURN_IN_FLIGHT:
        unsettled = _UNSETTLED.get()
        if unsettled is not None and unsettled.turns:
            unsettled.settle(session)  # this request's own earlier turn holds the lock: release it
        await session.lock.acquire()
        turn: Turn | None = None
        try:
            if session.finished or session.finishing:
                raise Conflict(
                    f"session {session.id!r} is finished", param="session_id", code="session_finished"
                )
            turn = Turn(session, new_rid(), arrived)
            session.active_rids.add(turn.rid)
            session.last_active = time.monotonic()
            yield turn
        finally:
            if turn is None:
                session.lock.release()
            else:
                session.active_rids.discard(turn.rid)
                unsettled = _UNSETTLED.get() if turn.committed else None
                if unsettled is not None and unsettled.open:
                    unsettled.turns.append(turn)
                else:
                    _settle(turn)


def _settle(turn: Turn) -> None:
    """Apply a finished turn to its session and release the session (never raises).

    A committed turn's record is already in the journal: if applying it fails here, the ledger
    cannot be trusted, so capture turns off (no sample is trained on) and the error is logged.
    """
    session = turn.session
    try:
        if not turn.committed:
            session.failed_turns += 1
            return
        session.turns += 1
        record = turn.record
        if record is None:  # committed by hand (a test of the counters): nothing to apply
            return
        # Generated either way: counted against the tenant, and the request metered as a turn.
        turn_generated(session.tenant, turn.generated)
        metrics.turn_generated(turn.surface, turn.generated)
        try:
            apply_record(session, record, committed_at=turn.committed_at)
        except Exception:
            log.exception("applying a committed turn failed", extra={"fields": {"session": session.id}})
            if session.ledger is not None:
                session.ledger.invalidate("internal error: a committed turn could not be applied")
            return
        if record.commit is not None:
            metrics.turn_recorded(len(record.commit.prompt_ids) + turn.generated, turn.generated)
            if record.segment is not None:
                metrics.SEGMENTS.labels(record.segment[0]).inc()
    finally:
        session.lock.release()


def decide(session: Session, violation: Violation, event: str | None) -> tuple[str, str] | str:
    """The session policy's answer to a rewritten history, without changing anything yet.

    Returns `(cause, detail)` for a new segment, or the reason capture turns off
    (passthrough); `refuse` raises 409. An agent-stated cause (`X-Rlgw-Event`) names the segment.
    """
    if session.policy is Policy.REFUSE:
        raise Conflict(f"{violation}; this session's policy is 'refuse'", code="history_rewritten")
    if session.policy is Policy.PASSTHROUGH:
        return str(violation)
    return (event or violation.cause, str(violation))


def duplicate_cause(turn: Turn, last_committed_at: float) -> str:
    """A duplicate of the last request is a retry if it arrived after that turn committed (the
    agent lost the reply), and concurrent if it arrived while that turn was still running."""
    return Cause.CONCURRENT if turn.arrived < last_committed_at else Cause.RETRY


def engine_sampling(
    profile: ModelProfile,
    session: Session,
    requested: dict[str, Any],
    max_tokens: int | None,
    top_logprobs: int,
    prompt_len: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """SGLang sampling params for the turn, and what the agent asked for that was overridden.

    In a session whose sampling precedence is `session` (capture mode's default) the trainer
    owns temperature, top_p, top_k, min_p and the seed: the agent's values are not applied and
    are returned for the sample's metadata. `max_new_tokens` is checked against the context;
    a refusal changes nothing in the session. A turn that names no cap (nor does its session's
    `max_tokens`) gets `profile.default_max_tokens`, or what is left of the context if less.
    """
    room = profile.context_length - prompt_len
    if room <= 0:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {profile.context_length} tokens. However, your "
            f"messages resulted in {prompt_len} tokens.",
            param="messages",
            prompt_tokens=prompt_len,
            limit=profile.context_length,
        )
    max_new = max_tokens if max_tokens is not None else session.sampling.get("max_tokens")
    if max_new is not None and max_new > room:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {profile.context_length} tokens. However, you "
            f"requested {prompt_len + max_new} tokens ({prompt_len} in the messages, {max_new} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens",
            prompt_tokens=prompt_len,
            max_tokens=max_new,
            limit=profile.context_length,
        )
    overridden: dict[str, Any] = {}
    sp = {k: v for k, v in session.sampling.items() if k != "max_tokens"}
    for k, v in requested.items():
        if session.sampling_precedence == "session" and k in OWNED_SAMPLING:
            overridden[k] = v
        else:
            sp[k] = v
    agents_seed = "sampling_seed" in requested and "sampling_seed" not in overridden
    if "sampling_seed" in sp and not agents_seed:
        # A session's seed makes the session repeatable, turn by turn: turn k (in the order turns
        # take the session's lock) draws with a seed derived from (seed, k). The seed itself on
        # every turn would replay one random stream in all of them, correlating the turns'
        # draws. An agent's own seed (where the agent's sampling applies) is sent as it is.
        sp["sampling_seed"] = derived_seed(sp["sampling_seed"], session.turns + session.failed_turns)
    if max_new is None:  # no cap named: the gateway's default, within the context
        max_new = min(room, profile.default_max_tokens or room)
    sp["max_new_tokens"] = int(max_new)
    if top_logprobs:
        sp["top_logprobs_num"] = top_logprobs
    return sp, overridden


@dataclass(slots=True)
class Outcome:
    """What a surface's turn code made of a generation, for the record: the id it answered
    with, the calls it minted, the text and parse errors, and the sampling it ran with."""

    response_id: str
    content: str
    overridden: dict[str, Any]  # what the agent asked for that the session's sampling overrode
    sampling: dict[str, Any] | None = None  # what the engine ran with (its temperature is noted)
    call_ids: list[str] = field(default_factory=list)
    calls: tuple[tuple[str, str], ...] = ()  # (name, canonical arguments) per minted call
    parse_errors: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, list[Any]] = field(default_factory=dict)  # for the sample's metadata
    end_of_turn_id: int | None = None  # the template's (None: a completions series has none)


async def commit(
    profile: ModelProfile, turn: Turn, plan: Plan, result: GenerationResult, outcome: Outcome
) -> None:
    """Journal the finished turn; it is applied (the plan's segment change and the generation)
    when it settles (`turn_scope`).

    The journal row is durable before the turn is applied and answered (`sessions/journal.py`). A
    generation that filled the model's whole context sets the session's termination reason to
    `context_length_exceeded` (a refused request never does). The turn counts as closed only
    when its last sampled id is the template's end-of-turn token: a turn cut by length, a stop
    string or another EOS gets the template's closing in the next increment, as a full render has it.
    `outcome.sampling` is what the engine ran with; its temperature goes to the sample's
    `turn_temperature`.
    """
    session = turn.session
    ledger = session.ledger
    record = TurnRecord(
        version=result.weight_version,
        invalidate=plan.invalidate,
        context_exhausted=result.finish_type == "length"
        and len(plan.input_ids) + len(result.output_ids) >= profile.context_length,
    )
    if plan.recorded and ledger is not None and ledger.capturing:
        check_sampled(result.output_ids, result.logprobs)  # what applying would refuse, refused now
        out = result.output_ids
        record.conversation, record.parent, record.segment = plan.conversation, plan.parent, plan.segment
        record.replace, record.echo_matches, record.echo_edits = (
            plan.replace_last,
            plan.echo_matches,
            plan.echo_edits,
        )
        record.overridden, record.notes = outcome.overridden, outcome.notes
        # The temperature the engine sampled (and scaled the logprobs) at: a trainer divides its
        # logits by it to compute the same logprobs (`turn_temperature` in the sample's metadata).
        sampling = outcome.sampling
        record.temperature = None if sampling is None else float(sampling.get("temperature", 1.0))
        record.commit = TurnCommit(
            new_messages=None,  # their digests (`records`): all the ledger keeps of them
            records=new_records(plan),
            prompt_ids=plan.increment,
            output_ids=out,
            logprobs=result.logprobs,
            version_spans=result.version_spans,
            response_id=outcome.response_id,
            tool_call_ids=tuple(outcome.call_ids),
            content=outcome.content,
            rid=result.rid,
            finish_type=result.finish_type,
            ended_with_stop_token=bool(out) and out[-1] == outcome.end_of_turn_id,
            parse_errors=outcome.parse_errors,
            agent_text=plan.agent_text,
            surface=plan.surface,
            tools=plan.tools,
            calls=outcome.calls,
            history=plan.history,
            routed_experts=turn_routing(profile, plan, result),
        )
    if session.journal is not None and ledger is not None:
        try:
            # `index`: a shared journal refuses the row if another gateway moved the session on.
            await session.journal.turn(session.id, record.to_journal(), index=session.turns)
        except SessionMoved:
            session.stale = True  # the table serves the next call from the journal's turns
            raise
    turn.committed, turn.record, turn.committed_at = True, record, time.monotonic()
    turn.generated, turn.surface = len(result.output_ids), plan.surface
