"""Colocated hand-off: the trainer gives tensors to an engine on the same host without a copy on the wire.

Two carriers, both described by a JSON manifest (names, dtypes, shapes, offsets, handles) that travels
base64-encoded in SGLang's `serialized_named_tensors` slot; nothing is ever pickled:
- `rlgw_shm` (CPU): one POSIX shared-memory block owned by the trainer (`ShmSender`, reused across
  syncs so its pages are faulted in once); the engine maps it and copies into its parameters.
- `rlgw_cuda_ipc` (GPU): CUDA IPC handles of the trainer's storages; the engine opens them and copies
  device to device. The trainer must keep the tensors alive until the engine has answered.
The engine side (`open_manifest`) validates every entry against the block before viewing it. This
module does not know HTTP or the engine.
"""

from __future__ import annotations

import base64
import mmap
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import shared_memory

import orjson
import torch

from rlgw.sync.errors import TransferError
from rlgw.sync.tensors import from_bytes, st_dtype, tensor_bytes, torch_dtype

SHM = "rlgw_shm"
CUDA_IPC = "rlgw_cuda_ipc"
_SHM_NAME = re.compile(r"^rlgw-[A-Za-z0-9_-]{1,64}$")


def encode_manifest(manifest: dict) -> str:
    """The manifest as SGLang's per-rank base64 string."""
    return base64.b64encode(orjson.dumps(manifest)).decode()


def decode_manifest(text: str) -> dict:
    """Parse a base64 JSON manifest; raises TransferError if it is anything else (pickles included)."""
    try:
        doc = orjson.loads(base64.b64decode(text, validate=True))
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise TransferError(f"serialized_named_tensors is not a base64 JSON manifest: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("tensors"), list):
        raise TransferError("manifest must be an object with a 'tensors' list")
    return doc


class ShmSender:
    """Trainer side of `rlgw_shm`: packs tensors into one reusable shared-memory block."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None

    def pack(self, named: Iterable[tuple[str, torch.Tensor]]) -> dict:
        """Copy `named` into the block (grown if needed) and return the manifest describing it."""
        items = [(n, tensor_bytes(t), st_dtype(t.dtype), list(t.shape)) for n, t in named]
        size = sum(b.size for _, b, _, _ in items)
        if self._shm is None or self._shm.size < size:
            self.close()
            self._shm = shared_memory.SharedMemory(
                name=f"rlgw-{secrets.token_hex(8)}", create=True, size=max(size, 1)
            )
        buf = self._shm.buf
        entries, pos = [], 0
        for name, data, dtype, shape in items:
            buf[pos : pos + data.size] = memoryview(data).cast("B")
            entries.append(
                {"name": name, "dtype": dtype, "shape": shape, "offset": pos, "nbytes": int(data.size)}
            )
            pos += data.size
        return {"carrier": SHM, "shm": self._shm.name, "size": self._shm.size, "tensors": entries}

    def close(self) -> None:
        """Unlink the block (the engine must be done with it)."""
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None


def cuda_ipc_manifest(named: Iterable[tuple[str, torch.Tensor]]) -> dict:
    """Trainer side of `rlgw_cuda_ipc`: IPC handles of CUDA tensors (kept alive by the caller)."""
    entries = []
    for name, t in named:
        if t.device.type != "cuda":
            raise TransferError(f"{name}: CUDA IPC needs a CUDA tensor, got {t.device}")
        t = t.detach()
        (dev, handle, size, off, rc_handle, rc_off, ev_handle, ev_sync) = t.untyped_storage()._share_cuda_()
        entries.append(
            {
                "name": name,
                "dtype": st_dtype(t.dtype),
                "shape": list(t.shape),
                "stride": list(t.stride()),
                "storage_offset": t.storage_offset(),
                "ipc": [
                    dev,
                    base64.b64encode(handle).decode(),
                    size,
                    off,
                    base64.b64encode(rc_handle).decode(),
                    rc_off,
                    base64.b64encode(ev_handle).decode() if ev_handle else None,
                    ev_sync,
                ],
            }
        )
    return {"carrier": CUDA_IPC, "tensors": entries}


@dataclass
class OpenedTensors:
    """Tensors viewing the trainer's memory; call `close()` once they have been copied."""

    named: list[tuple[str, torch.Tensor]]
    _map: mmap.mmap | None = None

    def close(self) -> None:
        self.named = []
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a tensor view is still referenced; the mapping goes when it is collected
            self._map = None


def open_manifest(manifest: dict) -> OpenedTensors:
    """Engine side: view the tensors a manifest describes, after validating every entry."""
    carrier = manifest.get("carrier")
    if carrier == SHM:
        return _open_shm(manifest)
    if carrier == CUDA_IPC:
        return _open_cuda_ipc(manifest)
    raise TransferError(f"unknown carrier {carrier!r} (expected {SHM} or {CUDA_IPC})")


def _open_shm(manifest: dict) -> OpenedTensors:
    name = manifest.get("shm")
    if not isinstance(name, str) or not _SHM_NAME.match(name):
        raise TransferError(f"shared-memory name {name!r} is not an rlgw block")
    # Mapped straight from /dev/shm rather than through `SharedMemory`, whose resource tracker (before
    # Python 3.13) would claim the trainer's block and unlink it when this process exits.
    try:
        fd = os.open(f"/dev/shm/{name}", os.O_RDONLY)
    except OSError as exc:
        raise TransferError(f"shared-memory block {name!r} cannot be opened: {exc.strerror}") from exc
    try:
        size = os.fstat(fd).st_size
        # Copy-on-write: writable for torch.frombuffer, and the engine can never alter the trainer's bytes.
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
    finally:
        os.close(fd)
    named = []
    try:
        for e in manifest["tensors"]:
            dtype, shape, off, n = (
                e["dtype"],
                tuple(int(x) for x in e["shape"]),
                int(e["offset"]),
                int(e["nbytes"]),
            )
            expect = torch.Size(shape).numel() * torch.empty(0, dtype=torch_dtype(dtype)).element_size()
            if n != expect or off < 0 or off + n > size:
                raise TransferError(
                    f"{e['name']}: entry ({off}+{n} bytes for {dtype}{list(shape)}) outside the block"
                )
            named.append((str(e["name"]), from_bytes(memoryview(mm)[off : off + n], dtype, shape)))
    except (KeyError, TypeError, ValueError) as exc:
        raise TransferError(f"bad manifest entry: {exc!r}") from exc
    return OpenedTensors(named, mm)


def _open_cuda_ipc(manifest: dict) -> OpenedTensors:
    if not torch.cuda.is_available():
        raise TransferError("CUDA IPC hand-off on an engine without CUDA")
    named = []
    try:
        for e in manifest["tensors"]:
            dev, handle, size, off, rc_handle, rc_off, ev_handle, ev_sync = e["ipc"]
            storage = torch.UntypedStorage._new_shared_cuda(
                int(dev),
                base64.b64decode(handle),
                int(size),
                int(off),
                base64.b64decode(rc_handle),
                int(rc_off),
                base64.b64decode(ev_handle) if ev_handle else b"",
                bool(ev_sync),
            )
            t = torch.empty(0, dtype=torch_dtype(e["dtype"]), device=f"cuda:{int(dev)}")
            t.set_(storage, int(e["storage_offset"]), tuple(e["shape"]), tuple(e["stride"]))
            named.append((str(e["name"]), t))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise TransferError(f"bad CUDA IPC manifest entry: {exc!r}") from exc
    return OpenedTensors(named)
