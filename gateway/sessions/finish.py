"""Finishing a session: where its ledger becomes training samples.

Every segment is built into a `Sample`, checked against the hand-off contract, and the accepted
ones are committed to the store in one transaction before the answer leaves. Rejected segments
are reported with their reason, never passed on. The summary is committed with the samples, so
finishing twice returns the first summary (a retry is safe), also after the gateway that stored
it was killed before answering, and also from another gateway on the same store. From the
moment a finish starts no new turn starts, and a turn that is generating is aborted, so nothing
is served after finish that is not recorded. This module knows nothing about HTTP: the route
is `api.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlgw.gateway import metrics
from rlgw.gateway.engine_client.backend import ModelBackend
from rlgw.gateway.errors import RolloutStored
from rlgw.gateway.ledger.ledger import Segment
from rlgw.gateway.sample import RejectReason, SampleRejected, SampleStatus, validate_sample
from rlgw.gateway.sessions.journals import Journal
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.trajectories.backends import Store
from rlgw.gateway.trajectories.store import RolloutTaken

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the caller says about the finished run."""

    reward: float | None = None
    status: SampleStatus | None = None  # None: each sample's status describes its own segment's end
    termination_reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# Tests only: the process exits at the named point (`finish-stored`, `delete-stored`: right after the
# commit, before the answer), as a gateway killed there would, to prove a retry gets the answer.
KILL_AT_ENV = "RLGW_TEST_KILL_AT"


def crash_point(name: str) -> None:
    """Exit the process at once if the tests asked for a kill at `name`."""
    if os.environ.get(KILL_AT_ENV) == name:
        os._exit(137)


async def abort_active(backend: ModelBackend, session: Session) -> None:
    """Abort the session's generations in flight (an engine that cannot is not waited for)."""
    for rid in list(session.active_rids):
        with contextlib.suppress(Exception):
            await backend.abort(rid)


async def finish(
    session: Session,
    *,
    backend: ModelBackend,
    store: Store,
    journal: Journal | None,
    vocab_size: int,
    outcome: Outcome,
) -> dict[str, Any]:
    """Validate the ledger, store the accepted samples, and return the finish summary."""
    if session.finished:
        return session.summary
    # From here on no new turn starts (one waiting on the lock is refused with 409); a turn that
    # is generating is aborted, so nothing is served after finish that is not recorded.
    session.finishing = True
    await abort_active(backend, session)
    async with session.lock:
        if session.finished:
            return session.summary
        if outcome.termination_reason:
            session.termination_reason = outcome.termination_reason
        # Stored by a gateway killed before it answered (and before it closed the journal's row):
        # the retry gets that answer, and nothing is stored twice.
        if (stored := await store.outcome(session.tenant, session.id)) is not None:
            session.finished, session.summary, session.ledger = True, stored, None
            if journal is not None:
                await journal.closed(session.id)
            return stored
        try:
            # How to reproduce the engine's logprobs, whether its seeds hold (gateway/engine_semantics.py).
            semantics = getattr(backend, "semantics", None)
            engine = semantics.to_metadata() if semantics is not None else None
            summary = await store_samples(session, outcome, store=store, vocab_size=vocab_size, engine=engine)
        except RolloutTaken as taken:
            # Another live attempt of this rollout stored it first: this one's samples would be the
            # rollout a second time. Nothing was stored; the caller gets the stored run (409).
            session.finishing = False
            raise RolloutStored(taken.rollout_id, taken.summary) from None
        except BaseException:
            session.finishing = False  # nothing was stored: the session is as it was
            raise
        crash_point("finish-stored")
        session.finished = True
        session.summary = summary
        if journal is not None:
            await journal.closed(session.id)  # its samples are in the store now
        session.ledger = None  # the tokens are in the store now; free the memory
    log.info(
        "session finished",
        extra={
            "fields": {
                "session": session.id,
                "task": session.task_id,
                "samples": len(summary["samples"]),
                "rejects": len(summary["rejects"]),
                "trainable_tokens": summary["trainable_tokens"],
                "termination_reason": session.termination_reason,
            }
        },
    )
    return summary


async def store_samples(
    session: Session,
    outcome: Outcome,
    *,
    store: Store,
    vocab_size: int,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the session's samples, validate them, commit the accepted ones to `store` (one
    transaction) and return the finish summary; rejected segments are listed with their reason."""
    summary: dict[str, Any] = {
        "session_id": session.id,
        "mode": str(session.mode),
        "samples": [],
        "trainable_tokens": 0,
        "segments": 0,
        "rejects": [],
        "termination_reason": session.termination_reason,
        # What the finish said, so that a rerun of the rollout refused for it (`rollout_stored`)
        # can report the run as it ended.
        "reward": outcome.reward,
        "status": None if outcome.status is None else str(outcome.status),
    }
    ledger = session.ledger
    if ledger is None:  # eval mode records no samples, only its answer
        await asyncio.shield(
            store.add_samples(
                session.tenant,
                session.id,
                session.task_id,
                [],
                outcome=lambda _: summary,
                rollout_id=session.rollout_id,
            )
        )
        return summary
    metadata = {
        **session.metadata,
        **outcome.metadata,
        "task_id": session.task_id,
        "session_id": session.id,
        "termination_reason": session.termination_reason,
        # The session's own count; each sample's `turns` counts its segment's (Ledger.build_samples).
        "session_turns": session.turns,
        "failed_turns": session.failed_turns,
    }
    if engine:
        metadata["engine"] = engine
    built = ledger.build_samples(
        reward=outcome.reward,
        # None: each sample's status describes its own segment's end (cut by length: truncated).
        status=outcome.status,
        rollout_id=session.rollout_id,
        group_index=session.group_index,
        metadata=metadata,
    )
    summary["segments"] = len(built)
    summary["conversations"] = [
        {"conversation": c.index, "parent": c.parent, "segments": list(c.segments)}
        for c in ledger.conversations
    ]
    metrics.CONVERSATIONS.inc(len(ledger.conversations))
    summary["segment_causes"] = [
        {
            "segment": i,
            "conversation": seg.conversation,
            "cause": seg.cause,
            "detail": seg.detail,
            "tokens": len(seg),
            "trainable_tokens": seg.trainable_tokens(),
        }
        for i, seg in enumerate(ledger.segments)
    ]
    accepted = []
    for index, sample, why in built:
        if ledger.invalid_reason is not None:
            summary["rejects"].append(
                {
                    "segment": index,
                    "reason": str(RejectReason.CAPTURE_INVALID),
                    "detail": ledger.invalid_reason,
                }
            )
            continue
        if sample is None:
            summary["rejects"].append({"segment": index, "reason": str(RejectReason.EMPTY), "detail": why})
            continue
        try:
            validate_sample(sample, vocab_size=vocab_size)
        except SampleRejected as exc:
            reject = {"segment": index, "reason": str(exc.reason), "detail": exc.detail}
            if exc.reason is RejectReason.BAD_TOKEN:
                reject["turn"] = bad_token_turn(ledger.segments[index], vocab_size)
            summary["rejects"].append(reject)
            continue
        accepted.append((index, sample))
    for reject in summary["rejects"]:
        metrics.SAMPLE_REJECTS.labels(reject["reason"]).inc()

    def complete(cursors: list[int]) -> dict[str, Any]:
        """The summary with the accepted samples' cursors (built inside the store's transaction)."""
        for cursor, (index, sample) in zip(cursors, accepted, strict=True):
            trainable = int(sample.loss_mask.sum())
            summary["samples"].append(
                {
                    "cursor": cursor,
                    "segment": index,
                    "conversation": sample.metadata["conversation"],
                    "trainable_tokens": trainable,
                    "response_length": sample.response_length,
                }
            )
            summary["trainable_tokens"] += trainable
        return summary

    await asyncio.shield(
        store.add_samples(
            session.tenant,
            session.id,
            session.task_id,
            [s for _, s in accepted],
            segments=[i for i, _ in accepted],
            outcome=complete,
            rollout_id=session.rollout_id,
        )
    )
    return summary


def bad_token_turn(segment: Segment, vocab_size: int) -> int | None:
    """The index of the first generated turn holding an id outside the vocabulary."""
    ids = segment.ids_view()
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    for i, t in enumerate(segment.turns):
        if bad.size and t.start <= bad[0] < t.end:
            return i
    return None
