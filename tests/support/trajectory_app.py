"""A small FastAPI app around the trajectories router, served by a real uvicorn in the test's loop.

Real streaming needs a real server (httpx's ASGITransport buffers whole bodies); running it
in the test's own event loop lets the test write to the same store the server reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from rlgw.gateway.http.errors import install_error_handlers
from rlgw.gateway.tenancy.tenants import KeyTable
from rlgw.gateway.trajectories.api import router
from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.procs import free_port


def trajectory_app(store: TrajectoryStore, keys: dict[str, str] | None = None) -> FastAPI:
    """The router mounted the way the gateway mounts it; `keys` maps API key -> tenant."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    app.state.store = store
    app.state.tenant_keys = KeyTable()
    for key, tenant in (keys or {}).items():
        app.state.tenant_keys.add(key, tenant)
    return app


@contextlib.asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` on a free 127.0.0.1 port until the block ends; yields the base URL."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited before starting")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
