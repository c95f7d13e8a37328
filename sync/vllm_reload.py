"""Disk weight sync for vLLM engines: pull a published version to a host-local dir, reload it in place.

rlgw's own engine pulls and reloads behind one route (`/pull_weights`); vLLM has no such route, so
this module runs the pull here (`rlgw.sync.pull`: full copy or delta chain, every digest verified)
and drives the routes vLLM 0.32 offers for RL, all under `VLLM_SERVER_DEV_MODE=1`:

1. `POST /pause?mode=keep`: requests in flight are frozen, none is lost;
2. `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}`: every worker
   reloads the checkpoint in place (no restart, no new KV cache);
3. `POST /update_weight_version {"new_version": v}`: tokens sampled from here on carry `v` in their
   weight-version spans, so a request frozen at step 1 reports which tokens each version sampled;
4. `POST /reset_prefix_cache?reset_running_requests=true`: cached prefixes were computed by the old
   weights (running requests recompute theirs);
5. `POST /resume`; then `GET /weight_info` must name `v`, or the sync failed.

vLLM's NCCL/IPC weight-transfer engine (`/init_weight_transfer_engine`, `/update_weights`) moves
tensors without disk but needs GPUs on both sides; it is not driven here. The engine must see
`local` at the same path (it runs on this host, or `local` is shared). A checkpoint whose LM head is
tied to its embedding is refused: vLLM 0.32's layerwise reload puts the head's old tensor back (the
tie breaks), so the engine would sample from new layers and an old head.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path

import httpx

from rlgw.sync.errors import FleetMismatch, TransferError, WeightSyncError
from rlgw.sync.host_load import call, pull_and_load
from rlgw.sync.pull import PullResult

log = logging.getLogger(__name__)


def _call(client: httpx.AsyncClient, method: str, url: str, **kw: object) -> Awaitable[httpx.Response]:
    return call(client, method, url, missing="start vLLM with VLLM_SERVER_DEV_MODE=1", **kw)


async def reload_engine(client: httpx.AsyncClient, url: str, path: Path, version: str) -> float:
    """Reload `path` into the vLLM engine at `url` as `version`; returns the seconds it was paused."""
    await _call(client, "POST", f"{url}/pause", params={"mode": "keep"})
    t0 = time.perf_counter()
    try:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        await _call(client, "POST", f"{url}/collective_rpc", json=rpc)
        await _call(client, "POST", f"{url}/update_weight_version", json={"new_version": version})
        reset = await _call(
            client, "POST", f"{url}/reset_prefix_cache", params={"reset_running_requests": "true"}
        )
        if not reset.json().get("success"):
            raise TransferError(f"{url} could not reset its prefix cache after loading v{version}")
    finally:
        await _call(client, "POST", f"{url}/resume")
    paused = time.perf_counter() - t0
    served = (await _call(client, "GET", f"{url}/weight_info")).json().get("weight_version")
    if served != version:
        raise FleetMismatch(f"{url} serves weight version {served!r} after loading v{version}")
    return paused


async def apply_version(
    urls: Sequence[str],
    source: Path,
    version: int,
    local: Path | None,
    *,
    durable: bool = True,
    http_timeout: float = 600.0,
) -> PullResult:
    """Bring every vLLM engine at `urls` to `version` published under `source` (see the module doc).

    `local`: the host-local directory the version is materialized in (None: a full version is
    loaded from `source` itself). Raises `WeightSyncError` when any engine did not end on `version`.
    """
    result, paused = await pull_and_load(
        urls, source, version, local, reload_engine, durable=durable, http_timeout=http_timeout, check=_untied
    )
    log.info(
        "vLLM engines reloaded",
        extra={
            "fields": {"version": version, "engines": len(urls), "paused_s": [round(p, 3) for p in paused]}
        },
    )
    return result


def _untied(result: PullResult) -> None:
    config = result.path / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings"):
        raise WeightSyncError(
            f"v{result.version} ties the LM head to the embedding: vLLM 0.32's in-place reload keeps a "
            "tied head's old weights (it logs 'ParallelLMHead: Failed to load weights'), so the engine would "
            "serve a mix of versions. Serve and train the model untied (lm_head.weight written out, "
            "tie_word_embeddings false)"
        )


async def served_versions(urls: Sequence[str], http_timeout: float = 60.0) -> list[str]:
    """The weight version each vLLM engine at `urls` serves (`GET /weight_info`)."""
    async with httpx.AsyncClient(timeout=http_timeout) as client:
        docs = await asyncio.gather(*(_call(client, "GET", f"{u.rstrip('/')}/weight_info") for u in urls))
    return [str(r.json().get("weight_version")) for r in docs]
