"""Trainer-side driver of the engines' sync routes: disk pull, distributed broadcast, colocated hand-off.

Each operation runs on every engine, raises `WeightSyncError` if any engine refuses, and ends with
the fleet check (`rlgw.sync.fleet`): the sync is done only when every engine reports the new version
(and, for disk syncs, the published checkpoint digest). Publishing versions is
`rlgw.sync.publisher`'s job; this module only moves them to engines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync.broadcast import DEFAULT_BUCKET_BYTES, WeightUpdateGroup, make_buckets, send_bucket
from rlgw.sync.colocated import SHM, ShmSender, encode_manifest
from rlgw.sync.errors import TransferError, WeightSyncError
from rlgw.sync.fleet import EngineStatus, check_fleet, fleet_status

log = logging.getLogger(__name__)


async def _post_all(
    client: httpx.AsyncClient, urls: Sequence[str], path: str, bodies: Sequence[dict]
) -> list[dict]:
    async def one(url: str, body: dict) -> dict:
        try:
            r = await client.post(f"{url}{path}", json=body)
            doc = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            return {"success": False, "message": f"{url}{path}: {type(exc).__name__}: {exc}"}
        if r.status_code != 200 or not doc.get("success"):
            return {"success": False, "message": f"{url}{path}: {doc.get('message', r.text)}"}
        return doc

    return list(await asyncio.gather(*(one(u, b) for u, b in zip(urls, bodies, strict=True))))


def _raise_failures(docs: list[dict], what: str, exc: type[WeightSyncError] = WeightSyncError) -> None:
    failed = [d["message"] for d in docs if not d.get("success")]
    if failed:
        raise exc(f"{what} failed on {len(failed)} engine(s): " + "; ".join(failed))


class SyncClient:
    """Drives a fixed list of engines (base URLs)."""

    def __init__(self, engine_urls: Sequence[str], timeout: float = 600.0) -> None:
        if not engine_urls:
            raise ValueError("no engine URLs")
        self.urls = [u.rstrip("/") for u in engine_urls]
        self.timeout = timeout

    async def status(self, live: bool = True) -> list[EngineStatus]:
        """Every engine's version and checkpoint digests."""
        return await fleet_status(self.urls, live)

    async def pull(
        self, source_dir: Path, version: int, local_dir: Path | None = None, *, durable: bool = True
    ) -> list[dict]:
        """Full or delta disk sync: every engine pulls `version` from `source_dir` and reloads.

        `local_dir` is each engine host's local checkpoint directory (the same path on every host;
        engines sharing a host also share it safely: pulls are locked, a finished one is a no-op).
        """
        index = ck.read_index(source_dir / ck.version_dirname(version))
        body = {
            "source_dir": str(source_dir),
            "target_version": version,
            "local_checkpoint_dir": str(local_dir) if local_dir else None,
            "durable": durable,
        }
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            docs = await _post_all(client, self.urls, "/pull_weights", [body] * len(self.urls))
        _raise_failures(docs, f"pull of v{version}")
        # A delta index names the state after it, exactly like the full version it produces.
        check_fleet(await self.status(), str(version), index.checkpoint_digest)
        return docs

    async def broadcast(
        self,
        named: Iterable[tuple[str, torch.Tensor]],
        version: int | str,
        *,
        master_address: str = "127.0.0.1",
        master_port: int,
        backend: str = "gloo",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group_name: str = "weight_update_group",
        timeout_s: float = 120.0,
    ) -> None:
        """Distributed sync: form a group with every engine, send all buckets, commit, tear down.

        Buckets are staged on the engines; the final commit applies them (each engine pauses only
        for that copy), so a failed transfer leaves every engine on its old weights. `timeout_s`
        bounds each collective (an engine that refuses a bucket makes the sender wait this long).
        """
        world = len(self.urls) + 1
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            joins = asyncio.ensure_future(
                _post_all(
                    client,
                    self.urls,
                    "/init_weights_update_group",
                    [
                        {
                            "master_address": master_address,
                            "master_port": master_port,
                            "rank_offset": i + 1,
                            "world_size": world,
                            "group_name": group_name,
                            "backend": backend,
                            "timeout_s": timeout_s,
                        }
                        for i in range(len(self.urls))
                    ],
                )
            )
            try:
                group = await asyncio.to_thread(
                    WeightUpdateGroup, master_address, master_port, 0, world, group_name, backend, timeout_s
                )
            finally:
                docs = await joins
            try:
                _raise_failures(docs, "joining the weight update group", TransferError)
                t0, sent = time.perf_counter(), 0
                for bucket in make_buckets(named, bucket_bytes):
                    body = {**bucket.announce(), "group_name": group_name, "rlgw_stage": True}
                    acks = asyncio.ensure_future(
                        _post_all(
                            client, self.urls, "/update_weights_from_distributed", [body] * len(self.urls)
                        )
                    )
                    try:
                        await asyncio.to_thread(send_bucket, group, bucket)
                    finally:
                        docs = await acks
                    _raise_failures(docs, "a broadcast bucket", TransferError)
                    sent += bucket.nbytes
                commit = {
                    "names": [],
                    "dtypes": [],
                    "shapes": [],
                    "group_name": group_name,
                    "weight_version": str(version),
                }
                docs = await _post_all(
                    client, self.urls, "/update_weights_from_distributed", [commit] * len(self.urls)
                )
                _raise_failures(docs, f"committing v{version}", TransferError)
                log.info(
                    "broadcast weights",
                    extra={
                        "fields": {
                            "version": str(version),
                            "bytes": sent,
                            "seconds": round(time.perf_counter() - t0, 3),
                        }
                    },
                )
            finally:
                await _post_all(
                    client,
                    self.urls,
                    "/destroy_weights_update_group",
                    [{"group_name": group_name}] * len(self.urls),
                )
                group.destroy()
        check_fleet(await self.status(), str(version))

    async def handoff(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int | str, sender: ShmSender
    ) -> None:
        """Colocated sync through `sender`'s shared-memory block (engines on this host)."""
        manifest = encode_manifest(sender.pack(named))
        body = {"serialized_named_tensors": [manifest], "load_format": SHM, "weight_version": str(version)}
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            docs = await _post_all(client, self.urls, "/update_weights_from_tensor", [body] * len(self.urls))
        _raise_failures(docs, "colocated hand-off", TransferError)
        check_fleet(await self.status(), str(version))
