"""The admin HTTP API: add, list, re-limit and revoke tenants (`/admin/tenants`), with the admin key.

Changes go to the tenant store first and then into this process's key and limit tables, so a
new key works on the next request and a revoked one stops at once. Other gateway processes
on the same data dir pick changes up within `SYNC_INTERVAL_S` (`sync_loop`).

This module owns the admin routes and keeping the in-memory tables in step with the store;
storage is `tenant_store`'s, key matching `tenants`', limit enforcement `limits`'.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from rlgw.gateway.errors import NotFound
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.tenancy.limits import Limits, LimitTable, open_in
from rlgw.gateway.tenancy.store import TenantStore, check_name
from rlgw.gateway.tenancy.tenants import KeyTable, require_admin

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

SYNC_INTERVAL_S = 2.0


class LimitsBody(BaseModel):
    """A tenant's limits; a missing or null field uses the gateway's default."""

    model_config = ConfigDict(extra="forbid")

    open_sessions: int | None = Field(None, ge=0)
    in_flight: int | None = Field(None, ge=0)
    tokens_per_minute: int | None = Field(None, ge=0)


class TenantCreate(BaseModel):
    """`POST /admin/tenants` body."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    limits: LimitsBody = Field(default_factory=LimitsBody)


def apply_tenants(store: TenantStore, keys: KeyTable, limits: LimitTable) -> int:
    """Load the store's tenants into the key and limit tables; returns how many there are."""
    tenants = store.list()
    keys.replace_stored({t.key_digest: t.name for t in tenants})
    limits.replace_overrides({t.name: t.limits for t in tenants})
    return len(tenants)


async def sync_loop(app: FastAPI) -> None:
    """Re-read the tenant store whenever another process changed it (polled)."""
    state = app.state
    while True:
        await asyncio.sleep(SYNC_INTERVAL_S)
        try:
            if await asyncio.to_thread(state.tenant_store.changed):
                n = await asyncio.to_thread(
                    apply_tenants, state.tenant_store, state.tenant_keys, state.limits
                )
                log.info("tenants reloaded", extra={"fields": {"tenants": n}})
        except sqlite3.Error as exc:
            # A busy or briefly unreadable file: keep the tables as they are and try again.
            log.warning("tenant store unreadable", extra={"fields": {"error": str(exc)}})


async def _reload(request: Request) -> None:
    state = request.app.state
    await asyncio.to_thread(apply_tenants, state.tenant_store, state.tenant_keys, state.limits)


@router.post("/tenants")
async def add_tenant(request: Request, body: TenantCreate) -> Response:
    """Create a tenant; the answer holds its API key, which is shown only this once."""
    store: TenantStore = request.app.state.tenant_store
    wanted = Limits(body.limits.open_sessions, body.limits.in_flight, body.limits.tokens_per_minute)
    tenant, key = await asyncio.to_thread(store.add, check_name(body.name), wanted)
    await _reload(request)
    log.info("tenant added", extra={"fields": {"tenant": tenant.name, **wanted.to_dict()}})
    return json_response(201, {**tenant.to_dict(), "api_key": key})


@router.get("/tenants")
async def list_tenants(request: Request) -> Response:
    """Every stored tenant with its limits (its own and the effective ones) and current use."""
    state = request.app.state
    table: LimitTable = state.limits
    tenants = await asyncio.to_thread(state.tenant_store.list)
    open_counts = table.open_sessions(open_in(state.sessions))
    data = [
        {
            **t.to_dict(),
            "effective_limits": table.limits_for(t.name).to_dict(),
            "open_sessions": open_counts.get(t.name, 0),
            "in_flight": table.in_flight(t.name),
        }
        for t in tenants
    ]
    return json_response(200, {"object": "list", "data": data})


@router.put("/tenants/{name}/limits")
async def set_tenant_limits(request: Request, name: str, body: LimitsBody) -> Response:
    """Replace a tenant's own limits (null fields: the gateway's defaults); its key is unchanged."""
    wanted = Limits(body.open_sessions, body.in_flight, body.tokens_per_minute)
    if not await asyncio.to_thread(request.app.state.tenant_store.set_limits, name, wanted):
        raise NotFound(f"no tenant {name!r}", param="name", code="tenant_not_found")
    await _reload(request)
    log.info("tenant limits set", extra={"fields": {"tenant": name, **wanted.to_dict()}})
    return json_response(200, {"name": name, "limits": wanted.to_dict()})


@router.delete("/tenants/{name}")
async def revoke_tenant(request: Request, name: str) -> Response:
    """Revoke a tenant: its key stops working now. Its open sessions keep their own keys until
    they finish or expire (a rollout in progress is not cut off mid-task)."""
    if not await asyncio.to_thread(request.app.state.tenant_store.revoke, name):
        raise NotFound(f"no tenant {name!r}", param="name", code="tenant_not_found")
    await _reload(request)
    log.info("tenant revoked", extra={"fields": {"tenant": name}})
    return json_response(200, {"name": name, "revoked": True})
