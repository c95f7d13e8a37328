"""Operations routes: `/healthz` (the process is up), `/readyz` (it can serve), `/metrics`.

`/readyz` checks what a turn needs, each with a short timeout: the engine answers
`/model_info`, the trajectory store's and the session journal's files take a write lock, and
the start-up template probe passed (or its mismatch was explicitly allowed). It answers 503 naming the failed
checks, so a load balancer stops routing and an operator sees why.

`/metrics` is Prometheus' text format (`metrics.exposition`); when an admin key is set it
needs that key (tenant names are labels). This module owns these routes only; what is
measured is `metrics`'.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from rlgw.gateway import metrics
from rlgw.gateway.errors import AuthError
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.tenancy.limits import open_in
from rlgw.gateway.tenancy.tenants import bearer_key

router = APIRouter()

CHECK_TIMEOUT_S = 2.0


async def _check(name: str, work: Any) -> tuple[str, str | None]:
    try:
        await asyncio.wait_for(work, CHECK_TIMEOUT_S)
    except Exception as exc:  # any failure makes the gateway not ready; its text says why
        return name, f"{type(exc).__name__}: {exc}"[:300]
    return name, None


@router.get("/healthz")
async def healthz() -> Response:
    """200 while the process serves HTTP (liveness)."""
    return json_response(200, {"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """200 if the engine answers, the store and journal are writable and the template probe passed;
    else 503."""
    state = request.app.state
    checks_to_run = [
        _check("engine", state.backend.model_info()),
        _check("store", state.store.ready()),
    ]
    journal = state.sessions.journal
    if journal is not None:
        checks_to_run.append(_check("journal", journal.ready()))
    results = await asyncio.gather(*checks_to_run)
    checks: dict[str, Any] = {name: ("ok" if err is None else err) for name, err in results}
    probe = state.probe
    if probe.increment_matches_full_render:
        checks["template_probe"] = "ok"
    elif state.template_mismatch_allowed:
        checks["template_probe"] = "ok (mismatch allowed: " + probe.summary() + ")"
    else:
        checks["template_probe"] = probe.summary()
    ready = all(str(v).startswith("ok") for v in checks.values())
    return json_response(200 if ready else 503, {"ready": ready, "checks": checks})


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    """The process's metrics in Prometheus' text format."""
    state = request.app.state
    if state.tenant_keys.is_admin_required() and not state.tenant_keys.is_admin(bearer_key(request)):
        raise AuthError("/metrics needs the admin API key")
    # Counted here, on the event loop that owns the session table; serialized on a worker thread.
    open_sessions = state.limits.open_sessions(open_in(state.sessions))
    body, content_type = await asyncio.to_thread(metrics.exposition, open_sessions)
    return Response(body, media_type=content_type)
