"""Chunked positional file I/O shared by the full and delta paths: pread/pwrite, scratch buffers, workers.

Everything here moves bytes with `os.preadv` / `os.pwrite` (kernel copies, no Python-level byte
objects), so several threads can work on disjoint ranges of the same files while numpy, zstd and
xxhash release the GIL. Copies write straight into a shared mapping of the output file
(`MappedOutput`): the kernel copies the source's cached pages into the destination's once, and each
`BLOCK` is patched and hashed while it is still in the core's cache, so a copy touches memory about
as often as a memcpy does (a bounce buffer and `pwrite` would add a second full copy). It knows
nothing about versions or encodings.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from rlgw.sync.errors import CheckpointError

CHUNK = 4 << 20  # bytes per zstd frame of a dense delta, and the smallest scratch buffer
# Bytes per step of a scan, copy or patch: the block and its partners (the base block, the
# comparison mask) stay in a core's 1 MiB L2 between the passes over them, so each byte comes
# from memory once. Larger blocks spill to L3; smaller ones add per-call overhead.
BLOCK = 512 << 10
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
    dst: np.ndarray | None,
    patch: Callable[[np.ndarray, int], None] | None = None,
) -> str:
    """Copy `nbytes` from `src_fd` at `src_off` into `dst` block by block, patching and hashing on the way.

    `dst` is the tensor's range of a `MappedOutput` (the kernel copies straight into its pages);
    with `dst=None` the bytes are only hashed, through a scratch buffer. `patch(block, pos)` may
    modify each block in place (`pos` is its byte offset in the tensor) before it is hashed.
    Returns the xxh3-128 hex digest of the bytes written.
    """
    import xxhash

    h = xxhash.xxh3_128()
    pos = 0
    while pos < nbytes:
        n = min(BLOCK, nbytes - pos)
        block = dst[pos : pos + n] if dst is not None else scratch("stream", n)
        pread_into(src_fd, block, src_off + pos)
        if patch is not None:
            patch(block, pos)
        h.update(block)
        pos += n
    return h.hexdigest()


class MappedOutput:
    """An output file of exactly `size` bytes, open and mapped shared for writing (`array`, uint8).

    An existing file is reused, not truncated to zero: overwriting page-cache pages that already
    exist costs a memcpy, while fresh pages cost a fault each (several times slower on these VMs).
    Callers must write every byte (recycled files hold stale data); what they write reaches the
    file like a `pwrite` (an `fsync` of the file or directory tree makes it durable).
    """

    def __init__(self, path: os.PathLike | str, size: int) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._map: mmap.mmap | None = None
        try:
            os.ftruncate(self.fd, size)
            if size:
                self._map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self._map, dtype=np.uint8) if self._map else np.empty(0, np.uint8)

    def close(self) -> None:
        """Unmap and close; views of `array` must not be used afterwards."""
        self.array = np.empty(0, np.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # A view is still referenced (a traceback holding a frame); it unmaps when collected.
                pass
            self._map = None
        os.close(self.fd)
