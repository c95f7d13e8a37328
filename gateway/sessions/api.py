"""Session routes: open, inspect, finish (validate + store the samples: `finish.py`), delete.

Opening a session for a rollout whose finish is stored is refused (409 `rollout_stored`, with
that finish's summary): a runner retried after it died past the finish must not store it twice.

Finish and delete answer a retry as they answered the first call, also when the session is gone
from this gateway (its answer was lost: the gateway that stored it was killed, or the agent
moved to another gateway): both commit their outcome to the store before they answer.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from rlgw.gateway.errors import InvalidRequest, NotFound, RolloutStored
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.ledger.ledger import Policy
from rlgw.gateway.sample import SampleStatus
from rlgw.gateway.sessions.finish import Outcome, abort_active, crash_point, finish
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.tenancy.limits import open_in
from rlgw.gateway.tenancy.tenants import require_tenant

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
    # A rollout whose finish is stored is not run again (a retry of a runner that died after the
    # finish committed): the caller gets the stored summary, the trainer no second set of samples.
    if body.rollout_id is not None:
        if (stored := await state.store.finished_rollout(tenant, body.rollout_id)) is not None:
            raise RolloutStored(body.rollout_id, stored)
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
    if state.sessions.journal is not None and state.sessions.journal.shared:
        # A fleet's balancer picks a session's gateway by the id this one just minted, so another
        # gateway may serve it. Keep no copy here: a copy this gateway never sees the turns of goes
        # stale; its first turn here would be generated, then refused at commit (`session_moved`)
        # and generated again. Whichever gateway serves it restores it from the journal.
        # So the open-session cap, which counts what this gateway holds, does not apply here.
        state.sessions.remove(session.id)
    else:
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


@router.delete("/v1/sessions/{session_id}")
async def delete_session(
    request: Request, session_id: str, tenant: str = Depends(require_tenant)
) -> Response:
    """Abort the session's in-flight generation and forget it; no samples are stored."""
    state = request.app.state
    sessions = state.sessions
    answer = {"session_id": session_id, "deleted": True}
    try:
        session = sessions.get(session_id, tenant)
    except NotFound:
        if await state.store.outcome(tenant, session_id) is None:
            raise
        return json_response(200, answer)  # a retry: the session was finished or deleted before
    await abort_active(state.backend, session)
    if not session.finished and await state.store.outcome(tenant, session_id) is None:
        await state.store.add_samples(tenant, session_id, session.task_id, [], outcome=lambda _: answer)
        crash_point("delete-stored")
    sessions.remove(session_id)
    if sessions.journal is not None:
        await sessions.journal.closed(session_id)
    return json_response(200, answer)


@router.post("/v1/sessions/{session_id}/finish")
async def finish_session(
    request: Request, session_id: str, body: SessionFinish, tenant: str = Depends(require_tenant)
) -> Response:
    """Validate the ledger, store the accepted samples, and answer a summary."""
    state = request.app.state
    try:
        session = state.sessions.get(session_id, tenant)
    except NotFound:
        stored = await state.store.outcome(tenant, session_id)
        if stored is None or stored.get("deleted"):
            raise
        return json_response(200, stored)  # a retry whose first answer was lost
    summary = await finish(
        session,
        backend=state.backend,
        store=state.store,
        journal=state.sessions.journal,
        vocab_size=state.vocab_size,
        outcome=Outcome(body.reward, body.status, body.termination_reason, body.metadata),
        routing=state.profile.routing,
    )
    return json_response(200, summary)
