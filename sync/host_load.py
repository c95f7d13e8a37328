"""Weight sync for engines that cannot pull a version themselves (vLLM, SGLang): the pull runs on this
host, then each engine loads the host-local copy through its own HTTP route.

This module owns what those engines share: one checked HTTP call (any non-200 is a `TransferError`)
and the pull-then-load-everywhere step. Which routes load a checkpoint, and what each engine must
report afterwards, is each engine's module (`vllm_reload.py`, `sglang_reload.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import httpx

from rlgw.sync.errors import TransferError, WeightSyncError
from rlgw.sync.pull import PullResult, pull

# (client, engine URL without a trailing slash, checkpoint dir, version) -> seconds the load took
Load = Callable[[httpx.AsyncClient, str, Path, str], Awaitable[float]]


async def call(
    client: httpx.AsyncClient, method: str, url: str, *, missing: str | None = None, **kw: object
) -> httpx.Response:
    """`method url`, its transport errors and non-200 answers raised as `TransferError`; a 404 is a
    `WeightSyncError` saying `missing` when given (the route is off, not the transfer broken)."""
    try:
        r = await client.request(method, url, **kw)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        raise TransferError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if r.status_code == 404 and missing:
        raise WeightSyncError(f"{url} is not served: {missing}")
    if r.status_code != 200:
        raise TransferError(f"{method} {url} answered {r.status_code}: {r.text[:500]}")
    return r


async def pull_and_load(
    urls: Sequence[str],
    source: Path,
    version: int,
    local: Path | None,
    load: Load,
    *,
    durable: bool,
    http_timeout: float,
    check: Callable[[PullResult], None] | None = None,
) -> tuple[PullResult, list[float]]:
    """Pull `version` from `source` into `local` on this host (`check` may refuse it), then `load` it
    into every engine at `urls` at once; returns the pull and each engine's load time."""
    result = await asyncio.to_thread(pull, source, version, local, durable=durable)
    if check is not None:
        check(result)
    async with httpx.AsyncClient(timeout=http_timeout) as client:
        took = await asyncio.gather(*(load(client, u.rstrip("/"), result.path, str(version)) for u in urls))
    return result, list(took)
