"""File I/O shared by the full and delta paths: positional writes, mapped outputs, scratch buffers.

Bytes move between memory, files and reusable per-thread scratch buffers without Python-level byte
objects: `pwrite_all` fills fresh files (kernel copies, no page fault per page), `OutputMap` lets
several threads fill disjoint ranges of one recycled file at memcpy speed, and `scratch` hands each
thread buffers that are touched once. It knows nothing about versions or encodings.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from rlgw.sync.errors import CheckpointError

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


class OutputMap:
    """An output file of exactly `size` bytes, its blocks reserved, mapped writable as a flat uint8 array.

    Threads fill disjoint ranges of `array` with plain memory copies: unlike `pwrite`, which holds
    the file's inode lock (one writer at a time on ext4) and copies through the kernel, stores into
    a shared mapping run in parallel at memcpy speed, and the page cache writes them back as usual
    (the caller's fsync covers them once the map is closed). The blocks are reserved first
    (`posix_fallocate`), so a full disk is an `OSError` here, never a SIGBUS on a store. An
    existing file is reused, as in `open_output`.
    """

    def __init__(self, path: os.PathLike | str, size: int) -> None:
        self.fd = open_output(path, size)
        self._mm: mmap.mmap | None = None
        try:
            if size:
                os.posix_fallocate(self.fd, 0, size)
                self._mm = mmap.mmap(
                    self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
        except OSError as exc:
            os.close(self.fd)
            raise CheckpointError(f"{path}: cannot reserve {size} bytes for writing ({exc})") from exc
        self.array: np.ndarray = (
            np.frombuffer(self._mm, dtype=np.uint8) if self._mm else np.empty(0, np.uint8)
        )

    def close(self) -> None:
        """Unmap and close; views of `array` must not be used afterwards."""
        self.array = np.empty(0, np.uint8)
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view is still alive somewhere: the mapping goes when it is collected
            self._mm = None
        os.close(self.fd)
