"""Disk weight sync for SGLang engines: pull a published version to a host-local dir, load it in place.

SGLang has no route that pulls a version itself (rlgw's own engine does, `/pull_weights`), so this
module runs the pull here (`rlgw.sync.pull`: full copy or delta chain, every digest verified) and
then drives the route SGLang 0.5 offers for RL: `POST /update_weights_from_disk {"model_path": dir,
"weight_version": v}`. SGLang pauses its scheduler, loads the checkpoint into the running model,
flushes its radix cache (its default `flush_cache`: cached prefixes were computed by the old
weights) and from then on reports `v` in every response's `meta_info.weight_version`; `GET
/model_info` must then name `v`, or the sync failed. The engine must see `local` at the same path
(it runs on this host, or `local` is shared).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from rlgw.sync.errors import FleetMismatch, TransferError
from rlgw.sync.host_load import call, pull_and_load
from rlgw.sync.pull import PullResult

log = logging.getLogger(__name__)


async def load_into_engine(client: httpx.AsyncClient, url: str, path: Path, version: str) -> float:
    """Load the checkpoint at `path` into the SGLang engine at `url` as `version`; returns the seconds
    the load took. Raises `FleetMismatch` when the engine then reports another version."""
    t0 = time.perf_counter()
    body = {"model_path": str(path), "weight_version": version}
    doc = (await call(client, "POST", f"{url}/update_weights_from_disk", json=body)).json()
    if not doc.get("success"):
        raise TransferError(f"{url} could not load v{version}: {doc.get('message')}")
    took = time.perf_counter() - t0
    served = await _served(client, url)
    if served != version:
        raise FleetMismatch(f"{url} serves weight version {served!r} after loading v{version}")
    return took


async def apply_version(
    urls: Sequence[str],
    source: Path,
    version: int,
    local: Path | None,
    *,
    durable: bool = True,
    http_timeout: float = 600.0,
) -> PullResult:
    """Bring every SGLang engine at `urls` to `version` published under `source` (see the module doc).

    `local`: the host-local directory the version is materialized in (None: a full version is
    loaded from `source` itself). Raises `WeightSyncError` when any engine did not end on `version`.
    """
    result, took = await pull_and_load(
        urls, source, version, local, load_into_engine, durable=durable, http_timeout=http_timeout
    )
    log.info(
        "SGLang engines loaded",
        extra={"fields": {"version": version, "engines": len(urls), "load_s": [round(t, 3) for t in took]}},
    )
    return result


async def _served(client: httpx.AsyncClient, url: str) -> str:
    return str((await call(client, "GET", f"{url}/model_info")).json().get("weight_version"))


async def served_versions(urls: Sequence[str], http_timeout: float = 60.0) -> list[str]:
    """The weight version each SGLang engine at `urls` serves (`GET /model_info`)."""
    async with httpx.AsyncClient(timeout=http_timeout) as client:
        return list(await asyncio.gather(*(_served(client, u.rstrip("/")) for u in urls)))
