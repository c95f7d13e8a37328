"""Chunked positional file I/O shared by the full and delta paths: pread/pwrite, scratch buffers, workers.

Everything here moves bytes between files and reusable per-thread scratch buffers with `os.preadv` /
`os.pwrite` (kernel copies, no page faults on fresh memory, no Python-level byte objects), so
several threads can work on disjoint ranges of the same files while numpy, zstd and xxhash release
the GIL. It knows nothing about versions or encodings.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from rlgw.sync.errors import CheckpointError

CHUNK = 4 << 20  # bytes per streamed chunk: fits in L2/L3 with its partner buffers
T = TypeVar("T")
R = TypeVar("R")

_local = threading.local()


def scratch(slot: str, size: int = CHUNK) -> np.ndarray:
    """A per-thread reusable uint8 buffer named `slot`, of at least `size` bytes (first touch once)."""
    bufs = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < size:
        buf = np.zeros(max(size, CHUNK), dtype=np.uint8)
        bufs[slot] = buf
    return buf[:size]


def pread_into(fd: int, buf: np.ndarray, offset: int) -> None:
    """Fill `buf` from `fd` at `offset`; a short read means the file is truncated."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise CheckpointError(f"short read at offset {offset + done}: file truncated")
        done += n


def pwrite_all(fd: int, buf: np.ndarray | memoryview | bytes, offset: int) -> None:
    """Write all of `buf` to `fd` at `offset`."""
    view = memoryview(buf).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


Progress = Callable[[int], None]


def run_parallel(
    fn: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    progress: Progress | None = None,
    size: Callable[[T], int] | None = None,
) -> list[R]:
    """`[fn(x) for x in items]` on `workers` threads (in order); the first exception propagates.

    `progress(size(x))` is called (on the caller's thread) as each item completes.
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        pool_map = map
        pool = None
    else:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlgw-sync")
        pool_map = pool.map
    try:
        out = []
        for item, result in zip(items, pool_map(fn, items), strict=True):
            out.append(result)
            if progress is not None and size is not None:
                progress(size(item))
        return out
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def default_workers() -> int:
    """Worker threads for encode/apply: `RLGW_SYNC_WORKERS`, else min(4, CPUs)."""
    env = os.environ.get("RLGW_SYNC_WORKERS")
    return int(env) if env else min(4, os.cpu_count() or 1)


def stream_tensor(
    src_fd: int,
    src_off: int,
    nbytes: int,
    dst_fd: int | None,
    dst_off: int,
    patch: Callable[[np.ndarray, int], None] | None = None,
) -> str:
    """Copy `nbytes` from `src_fd` to `dst_fd` chunk by chunk, patching and hashing on the way.

    `patch(chunk, pos)` may modify each chunk in place (`pos` is its byte offset in the tensor)
    before it is hashed and written. With `dst_fd=None` the bytes are only hashed. Returns the
    xxh3-128 hex digest of the bytes written.
    """
    import xxhash

    h = xxhash.xxh3_128()
    buf = scratch("stream")
    pos = 0
    while pos < nbytes:
        n = min(CHUNK, nbytes - pos)
        chunk = buf[:n]
        pread_into(src_fd, chunk, src_off + pos)
        if patch is not None:
            patch(chunk, pos)
        h.update(chunk)
        if dst_fd is not None:
            pwrite_all(dst_fd, chunk, dst_off + pos)
        pos += n
    return h.hexdigest()


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
