"""Session routes: open, inspect, finish (validate + store the samples), delete.

`finish` is where a session's ledger becomes training samples: every segment is built into a
`Sample`, checked against the hand-off contract, and the accepted ones are committed to the
store in one transaction before the answer leaves. Rejected segments are reported with their
reason, never passed on. Finishing twice returns the first summary (a retry is safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from rlgw.gateway import metrics
from rlgw.gateway.errors import InvalidRequest, json_response
from rlgw.gateway.ledger import Policy, Segment
from rlgw.gateway.limits import open_in
from rlgw.gateway.sample import RejectReason, SampleRejected, SampleStatus, validate_sample
from rlgw.gateway.sessions import Mode, Session
from rlgw.gateway.tenants import require_tenant

log = logging.getLogger(__name__)
router = APIRouter()

SAMPLING_KEYS = {"temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "presence_penalty", "seed"}
# Session keys spelled as the agents' APIs spell them, sent to the engine under SGLang's name.
_ENGINE_NAMES = {"seed": "sampling_seed"}


class SessionCreate(BaseModel):
    """`POST /v1/sessions` body."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1, max_length=512)
    mode: Mode = Mode.CAPTURE
    rollout_id: str | None = Field(None, max_length=512)
    group_index: int = Field(0, ge=0)
    policy: Policy | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    # Who wins on temperature, top_p, top_k, min_p and seed: the session's values ("session",
    # capture mode's default: the trainer owns sampling) or the agent's ("request", eval's default).
    sampling_precedence: Literal["session", "request"] | None = None


class SessionFinish(BaseModel):
    """`POST /v1/sessions/{id}/finish` body."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    status: SampleStatus | None = None
    termination_reason: str | None = Field(None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)


@router.post("/v1/sessions")
async def create_session(
    request: Request, body: SessionCreate | None = None, tenant: str = Depends(require_tenant)
) -> Response:
    """Open a session; answers its id, base URL for the agent, and API key."""
    if body is None:
        # FastAPI's own answer to a missing body names no field; name the one that is required.
        raise InvalidRequest(
            "the request has no JSON body; 'task_id' is required",
            param="task_id",
            code="missing_required_parameter",
        )
    unknown = set(body.sampling) - SAMPLING_KEYS
    if unknown:
        raise InvalidRequest(f"unknown sampling keys {sorted(unknown)}; allowed: {sorted(SAMPLING_KEYS)}")
    state = request.app.state
    state.limits.check_session_room(tenant, open_in(state.sessions))
    session, key = state.sessions.create(
        tenant=tenant,
        task_id=body.task_id,
        mode=body.mode,
        rollout_id=body.rollout_id,
        group_index=body.group_index,
        policy=body.policy or state.default_policy,
        metadata=body.metadata,
        sampling={_ENGINE_NAMES.get(k, k): v for k, v in body.sampling.items()},
        sampling_precedence=body.sampling_precedence,
    )
    if state.sessions.journal is not None:
        try:
            digest = state.sessions.key_digest_of(session.id)
            await state.sessions.journal.opened(session.id, session.settings(), digest)
        except BaseException:
            state.sessions.remove(session.id)  # not durable: not handed out
            raise
    state.limits.session_opened(tenant, session.id)
    base = state.public_url or str(request.base_url).rstrip("/")
    log.info(
        "session opened",
        extra={
            "fields": {"session": session.id, "task": body.task_id, "mode": str(body.mode), "tenant": tenant}
        },
    )
    return json_response(
        200,
        {
            "session_id": session.id,
            "base_url": f"{base}/s/{session.id}/v1",
            "api_key": key,
            "mode": str(session.mode),
            "rollout_id": session.rollout_id,
        },
    )


@router.get("/v1/sessions/{session_id}")
async def get_session(request: Request, session_id: str, tenant: str = Depends(require_tenant)) -> Response:
    """The session's state (no key, no tokens)."""
    session: Session = request.app.state.sessions.get(session_id, tenant)
    doc = session.describe()
    if session.summary is not None:
        doc["summary"] = session.summary
    return json_response(200, doc)


async def _abort_active(request: Request, session: Session) -> None:
    backend = request.app.state.backend
    for rid in list(session.active_rids):
        with contextlib.suppress(Exception):
            await backend.abort(rid)


@router.delete("/v1/sessions/{session_id}")
async def delete_session(
    request: Request, session_id: str, tenant: str = Depends(require_tenant)
) -> Response:
    """Abort the session's in-flight generation and forget it; nothing is stored."""
    sessions = request.app.state.sessions
    session = sessions.get(session_id, tenant)
    await _abort_active(request, session)
    sessions.remove(session_id)
    if sessions.journal is not None:
        await sessions.journal.closed(session_id)
    return json_response(200, {"session_id": session_id, "deleted": True})


@router.post("/v1/sessions/{session_id}/finish")
async def finish_session(
    request: Request, session_id: str, body: SessionFinish, tenant: str = Depends(require_tenant)
) -> Response:
    """Validate the ledger, store the accepted samples, and answer a summary."""
    state = request.app.state
    session: Session = state.sessions.get(session_id, tenant)
    if session.finished:
        return json_response(200, session.summary)
    # From here on no new turn starts (one waiting on the lock is refused with 409); a turn that
    # is generating is aborted, so nothing is served after finish that is not recorded.
    session.finishing = True
    await _abort_active(request, session)
    async with session.lock:
        if session.finished:
            return json_response(200, session.summary)
        if body.termination_reason:
            session.termination_reason = body.termination_reason
        try:
            summary = await _store_samples(request, session, body)
        except BaseException:
            session.finishing = False  # nothing was stored: the session is as it was
            raise
        session.finished = True
        session.summary = summary
        if state.sessions.journal is not None:
            await state.sessions.journal.closed(session.id)  # its samples are in the store now
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
    return json_response(200, summary)


async def _store_samples(request: Request, session: Session, body: SessionFinish) -> dict[str, Any]:
    state = request.app.state
    summary: dict[str, Any] = {
        "session_id": session.id,
        "mode": str(session.mode),
        "samples": [],
        "trainable_tokens": 0,
        "segments": 0,
        "rejects": [],
        "termination_reason": session.termination_reason,
    }
    ledger = session.ledger
    if ledger is None:  # eval mode records nothing
        return summary
    metadata = {
        **session.metadata,
        **body.metadata,
        "task_id": session.task_id,
        "session_id": session.id,
        "termination_reason": session.termination_reason,
        # The session's own counts; each sample's `turns` counts its segment's (ledger.build_samples).
        "session_turns": session.turns,
        "failed_turns": session.failed_turns,
    }
    built = ledger.build_samples(
        reward=body.reward,
        # None: each sample's status describes its own segment's end (cut by length: truncated).
        status=body.status,
        rollout_id=session.rollout_id,
        group_index=session.group_index,
        metadata=metadata,
    )
    summary["segments"] = len(built)
    summary["segment_causes"] = [
        {
            "segment": i,
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
            validate_sample(sample, vocab_size=state.vocab_size)
        except SampleRejected as exc:
            reject = {"segment": index, "reason": str(exc.reason), "detail": exc.detail}
            if exc.reason is RejectReason.BAD_TOKEN:
                reject["turn"] = _bad_token_turn(ledger.segments[index], state.vocab_size)
            summary["rejects"].append(reject)
            continue
        accepted.append((index, sample))
    for reject in summary["rejects"]:
        metrics.SAMPLE_REJECTS.labels(reject["reason"]).inc()
    if accepted:
        cursors = await asyncio.shield(
            state.store.add_samples(
                session.tenant,
                session.id,
                session.task_id,
                [s for _, s in accepted],
                segments=[i for i, _ in accepted],
            )
        )
        for cursor, (index, sample) in zip(cursors, accepted, strict=True):
            trainable = int(sample.loss_mask.sum())
            summary["samples"].append(
                {
                    "cursor": cursor,
                    "segment": index,
                    "trainable_tokens": trainable,
                    "response_length": sample.response_length,
                }
            )
            summary["trainable_tokens"] += trainable
    return summary


def _bad_token_turn(segment: Segment, vocab_size: int) -> int | None:
    """The index of the first generated turn holding an id outside the vocabulary."""
    ids = segment.ids_view()
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    for i, t in enumerate(segment.turns):
        if bad.size and t.start <= bad[0] < t.end:
            return i
    return None
