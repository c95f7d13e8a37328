"""`POST /v1/sessions` without a body names the missing field (issue 13, defect 9)."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from rlgw.gateway.http.errors import install_error_handlers
from rlgw.gateway.sessions import api as sessions_api
from rlgw.gateway.tenancy.tenants import KeyTable


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(sessions_api.router)
    app.state.tenant_keys = KeyTable()
    return app


async def test_missing_body_and_missing_field_name_task_id() -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as c:
        for kwargs in ({}, {"json": {}}):
            resp = await c.post("/v1/sessions", **kwargs)
            assert resp.status_code == 400, kwargs
            error = resp.json()["error"]
            assert error["param"] == "task_id" and "task_id" in error["message"], (kwargs, error)
            assert error["type"] == "invalid_request_error"
