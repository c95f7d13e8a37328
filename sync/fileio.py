"""File I/O shared by the full and delta paths: positional writes, recycled outputs, scratch buffers.

Bytes move between memory, files and reusable per-thread scratch buffers without Python-level byte
objects: `pwrite_all` writes from any buffer (a kernel copy, no page fault per page), `open_output`
reuses a retired file's cached pages, and `scratch` hands each thread buffers that are touched
once. It knows nothing about versions or encodings.
"""

from __future__ import annotations

import os
import threading

import numpy as np

CHUNK = 4 << 20  # bytes of tensor per dense-XOR zstd frame, and the least size of a scratch buffer

_local = threading.local()


def scratch(slot: str, size: int = CHUNK) -> np.ndarray:
    """A per-thread reusable uint8 buffer named `slot`, of at least `size` bytes (first touch once)."""
    bufs = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < size:
        buf = np.zeros(max(size, CHUNK), dtype=np.uint8)
        bufs[slot] = buf
    return buf[:size]


def pwrite_all(fd: int, buf: np.ndarray | memoryview | bytes, offset: int) -> None:
    """Write all of `buf` to `fd` at `offset`."""
    view = memoryview(buf).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def default_workers() -> int:
    """Worker threads for encode/apply: `RLGW_SYNC_WORKERS`, else min(4, CPUs)."""
    env = os.environ.get("RLGW_SYNC_WORKERS")
    return int(env) if env else min(4, os.cpu_count() or 1)


def open_output(path: os.PathLike | str, size: int) -> int:
    """Open `path` for positional writes, sized to exactly `size` bytes.

    An existing file is reused, not truncated to zero: overwriting page-cache pages that already
    exist costs a memcpy, while fresh pages cost a fault each (several times slower on these VMs).
    Callers must write every byte of the range (recycled files hold stale data).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd
