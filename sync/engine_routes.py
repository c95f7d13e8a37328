"""Engine-side weight-sync routes: delta/full pull, distributed broadcast, colocated hand-off, checkpoint.

The receiving end of each sync transport, served by the embedded engine: `rlgw engine` mounts `router`
beside the engine's own routes (`rlgw.engine.server.create_app(engine, routers)`), so the engine
imports nothing of sync's. The engine core is reached at `app.state.engine` through the weight
contract it documents (`rlgw.engine.core`). Every route answers SGLang's `{success, message}` with 200 or 400
(plus a few extra keys). A refused sync changes nothing: files are staged and verified before the
engine is touched, broadcast buckets are staged in memory until the final one, and the core's
`update_weights` validates every tensor before copying any. Sync operations on one engine are
serialized by a lock; generation keeps running on the old weights while files are prepared.

Routes (beyond SGLang's, which keep their shapes):
- `POST /pull_weights {source_dir, target_version, local_checkpoint_dir?, pause_mode?, durable?}`
- `GET /weight_checkpoint?live=1`: version, checkpoint dir and digest, and a digest of the live weights.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, ValidationError

from rlgw.sync import checkpoint as ck
from rlgw.sync.broadcast import FLATTENED, WeightUpdateGroup, receive_bucket
from rlgw.sync.colocated import CUDA_IPC, SHM, decode_manifest, open_manifest
from rlgw.sync.errors import WeightSyncError
from rlgw.sync.pull import pull
from rlgw.sync.tensors import tensor_bytes

log = logging.getLogger(__name__)
router = APIRouter()


@dataclass
class SyncState:
    """Per-engine sync state, kept on `app.state.weight_sync`."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    groups: dict[str, WeightUpdateGroup] = field(default_factory=dict)
    staged: dict[str, list[tuple[str, torch.Tensor]]] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    checkpoint_digest: str | None = None


def _state(request: Request) -> SyncState:
    st = getattr(request.app.state, "weight_sync", None)
    if st is None:
        st = request.app.state.weight_sync = SyncState()
    return st


def _reply(success: bool, message: str, status: int | None = None, **extra: Any) -> Response:
    body = {"success": success, "message": message, **extra}
    return Response(
        orjson.dumps(body), status_code=status or (200 if success else 400), media_type="application/json"
    )


class BadBody(ValueError):
    """A request body the route refuses (answered `{success: false}` with 400)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


async def _parse(request: Request, model: type[_Body]) -> _Body:
    raw = await request.body()
    try:
        return model.model_validate(orjson.loads(raw) if raw.strip() else {})
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadBody(f"invalid request body: {exc}") from exc


def _version_of(value: int | str) -> int:
    text = str(value).removeprefix("weight_v")
    if not text.isdigit():
        raise BadBody(f"target_version must be a version number, got {value!r}")
    return int(text)


class PullBody(_Body):
    source_dir: str
    target_version: int | str
    local_checkpoint_dir: str | None = None
    pause_mode: str = "in_place"
    durable: bool = True


@router.post("/pull_weights")
async def pull_weights(request: Request) -> Response:
    """Bring the local checkpoint to `target_version` (full or delta chain, verified), then reload."""
    try:
        body = await _parse(request, PullBody)
        target = _version_of(body.target_version)
        if body.pause_mode not in ("abort", "retract", "in_place"):
            raise BadBody(f"unknown pause_mode {body.pause_mode!r}")
    except BadBody as exc:
        return _reply(False, str(exc))
    engine, st = request.app.state.engine, _state(request)
    async with st.lock:
        local = Path(body.local_checkpoint_dir) if body.local_checkpoint_dir else None
        try:
            result = await asyncio.to_thread(
                pull, Path(body.source_dir), target, local, None, 2, body.durable
            )
        except WeightSyncError as exc:
            log.warning("pull refused", extra={"fields": {"target": target, "error": str(exc)}})
            return _reply(False, f"{type(exc).__name__}: {exc}", weight_version=engine.weight_version)
        version = str(target)
        if result.already and engine.weight_version == version:
            return _reply(
                True,
                f"already serving v{target} from {result.path}; nothing applied",
                weight_version=version,
                checkpoint_digest=result.checkpoint_digest,
                chain=[],
            )
        t0 = time.perf_counter()
        await engine.pause(body.pause_mode)
        try:
            await asyncio.to_thread(engine.flush_cache)
            await engine.load_weights_from_dir(result.path, version)
        except Exception as exc:  # the core refused: nothing changed, the old weights keep serving
            return _reply(False, f"reload refused: {exc}", weight_version=engine.weight_version)
        finally:
            await engine.resume()
        st.checkpoint_dir, st.checkpoint_digest = str(result.path), result.checkpoint_digest
        log.info(
            "pulled and reloaded weights",
            extra={
                "fields": {
                    "version": target,
                    "chain": result.chain,
                    "reload_s": round(time.perf_counter() - t0, 3),
                }
            },
        )
        return _reply(
            True,
            f"Succeeded to update model weights. Weight version updated to {version}.",
            weight_version=version,
            checkpoint_digest=result.checkpoint_digest,
            chain=result.chain,
            prepare_s=round(result.seconds, 3),
        )


class InitGroupBody(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    timeout_s: float = 120.0


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request) -> Response:
    """Join a weight update group at `rank_offset` (blocks until every rank has joined)."""
    try:
        body = await _parse(request, InitGroupBody)
    except BadBody as exc:
        return _reply(False, str(exc))
    st = _state(request)
    if body.group_name in st.groups:
        return _reply(False, f"group {body.group_name!r} already exists; destroy it first")
    try:
        group = await asyncio.to_thread(
            WeightUpdateGroup,
            body.master_address,
            body.master_port,
            body.rank_offset,
            body.world_size,
            body.group_name,
            body.backend,
            body.timeout_s,
        )
    except (WeightSyncError, ValueError) as exc:
        return _reply(False, str(exc))
    st.groups[body.group_name] = group
    return _reply(True, f"Succeeded to initialize group {body.group_name!r} as rank {body.rank_offset}.")


class DistributedBody(_Body):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    weight_version: str | None = None
    load_format: str | None = None
    flush_cache: bool = True
    rlgw_stage: bool = False  # keep this bucket staged; the next non-staged call applies everything


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request) -> Response:
    """Receive one announced bucket; apply all staged buckets atomically unless `rlgw_stage`."""
    try:
        body = await _parse(request, DistributedBody)
    except BadBody as exc:
        return _reply(False, str(exc))
    st, engine = _state(request), request.app.state.engine
    group = st.groups.get(body.group_name)
    if group is None:
        return _reply(False, f"no weight update group {body.group_name!r}; call /init_weights_update_group")
    if body.group_name not in st.staged:
        group.begin_transfer()  # the previous transfer was applied or dropped: reuse its buffers
    try:
        received = []
        if body.names:
            received = await asyncio.to_thread(
                receive_bucket, group, body.names, body.dtypes, body.shapes, body.load_format == FLATTENED
            )
        st.staged.setdefault(body.group_name, []).extend(received)
        if body.rlgw_stage:
            return _reply(True, f"staged {len(received)} tensors")
        named = st.staged.pop(body.group_name)
        await engine.update_weights(named, body.weight_version)
    except Exception as exc:  # transfer or validation failed: drop the staged bytes, keep the old weights
        st.staged.pop(body.group_name, None)
        return _reply(False, f"{type(exc).__name__}: {exc}", weight_version=engine.weight_version)
    st.checkpoint_dir = st.checkpoint_digest = None
    return _reply(True, f"Succeeded to update {len(named)} tensors.", weight_version=engine.weight_version)


class DestroyGroupBody(_Body):
    group_name: str = "weight_update_group"


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request) -> Response:
    """Leave and release a weight update group (dropping anything staged in it)."""
    try:
        body = await _parse(request, DestroyGroupBody)
    except BadBody as exc:
        return _reply(False, str(exc))
    st = _state(request)
    group = st.groups.pop(body.group_name, None)
    st.staged.pop(body.group_name, None)
    if group is None:
        return _reply(False, f"no weight update group {body.group_name!r}")
    await asyncio.to_thread(group.destroy)
    return _reply(True, f"Succeeded to destroy group {body.group_name!r}.")


class TensorBody(_Body):
    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    weight_version: str | None = None


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request) -> Response:
    """Colocated hand-off: apply tensors described by an `rlgw_shm` or `rlgw_cuda_ipc` manifest."""
    try:
        body = await _parse(request, TensorBody)
        if body.load_format not in (SHM, CUDA_IPC):
            raise BadBody(
                f"load_format {body.load_format!r} is not accepted: rlgw never unpickles tensors; "
                f"use {SHM!r} or {CUDA_IPC!r} with a JSON manifest"
            )
        if len(body.serialized_named_tensors) != 1:
            raise BadBody("expected exactly one manifest (this engine has one tensor-parallel rank)")
    except BadBody as exc:
        return _reply(False, str(exc))
    engine = request.app.state.engine
    async with _state(request).lock:
        try:
            manifest = decode_manifest(body.serialized_named_tensors[0])
            if manifest.get("carrier") != body.load_format:
                raise WeightSyncError(f"manifest carrier {manifest.get('carrier')!r} != load_format")
            opened = await asyncio.to_thread(open_manifest, manifest)
            try:
                await engine.update_weights(opened.named, body.weight_version)
            finally:
                opened.close()
        except Exception as exc:
            return _reply(False, f"{type(exc).__name__}: {exc}", weight_version=engine.weight_version)
        st = _state(request)
        st.checkpoint_dir = st.checkpoint_digest = None
    return _reply(
        True, f"Succeeded to update {len(manifest['tensors'])} tensors.", weight_version=engine.weight_version
    )


def live_digest(model: torch.nn.Module) -> str:
    """Combined xxh3-128 over every state_dict tensor's bytes, by name."""
    with torch.no_grad():
        return ck.combined_digest({n: ck.digest(tensor_bytes(t)) for n, t in model.state_dict().items()})


@router.get("/weight_checkpoint")
async def weight_checkpoint(request: Request, live: bool = True) -> Response:
    """What this engine serves: version, last verified checkpoint (dir, digest), digest of live weights."""
    engine, st = request.app.state.engine, _state(request)
    body: dict[str, Any] = {
        "weight_version": engine.weight_version,
        "checkpoint_dir": st.checkpoint_dir,
        "checkpoint_digest": st.checkpoint_digest,
    }
    if live:
        async with st.lock:
            body["live_digest"] = await asyncio.to_thread(live_digest, engine.model)
    return Response(orjson.dumps(body), media_type="application/json")
