"""Units of work on a few threads, and the in-order digest of a tensor whose segments finish out of order.

Weight sync splits every tensor into segments of `UNIT` bytes and each segment into steps of `STEP`
bytes: a segment is the unit a thread picks up (big tensors spread over all threads), a step the
amount that stays in a core's cache between being produced (copied, patched, compared) and being
hashed. xxh3 is a stream, so a tensor's steps are hashed in order: `OrderedDigest` lets whichever
thread finishes the next step in line hash it and every later step already done, so hashing runs on
the threads that just touched those bytes, overlapped with the other threads' work, and nobody waits.
numpy, zstd and xxhash release the GIL, so threads give real parallelism here.

What the units do (encode, apply, write) is not this module's business.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from rlgw.sync.errors import CheckpointError

UNIT = 16 << 20  # bytes of a tensor one thread takes at a time
STEP = 1 << 20  # bytes produced and then hashed while still in the core's cache (L2 here is 2 MiB)

Progress = Callable[[int], None]


def segments(nbytes: int, align: int = 8) -> list[tuple[int, int]]:
    """`(start, end)` byte ranges of at most `UNIT` bytes covering `nbytes`, starts aligned to `align`."""
    unit = max(align, UNIT - UNIT % align)
    return [(lo, min(lo + unit, nbytes)) for lo in range(0, nbytes, unit)] or [(0, 0)]


def steps(lo: int, hi: int) -> list[tuple[int, int]]:
    """`(start, end)` ranges of at most `STEP` bytes covering `[lo, hi)`; `STEP` divides `UNIT`."""
    return [(p, min(p + STEP, hi)) for p in range(lo, hi, STEP)]


class Pool:
    """Runs units (`submit(fn, *args)`) on `workers` threads; a unit may submit more units.

    `wait()` returns once every unit has run, calling `progress(n)` on the caller's thread for each
    `report(n)`. The first error wins: units not yet started are skipped, running ones finish (so no
    thread writes anything after `wait` returns), and `wait` raises it with the unit's stack as a
    note instead of its frames, so that no view of a mapped file outlives the failure. An `OSError`
    (a full disk, an unreadable file) is raised as a `CheckpointError`. With one worker, units run
    on the caller's thread in submission order.
    """

    def __init__(self, workers: int) -> None:
        self._lock = threading.Lock()
        # The caller's own token: units that finish before the caller is done submitting never see 0.
        self._pending = 1
        self._error: BaseException | None = None
        self._events: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._inline: list[tuple[Callable[..., None], tuple]] | None = [] if workers <= 1 else None
        self._pool = (
            None if workers <= 1 else ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlgw-sync")
        )

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        """Schedule `fn(*args)` (from any thread, including a running unit)."""
        with self._lock:
            self._pending += 1
        if self._inline is not None:
            self._inline.append((fn, args))
        else:
            self._pool.submit(self._run, fn, args)

    def report(self, nbytes: int) -> None:
        """Count `nbytes` as done, for the progress callback."""
        self._events.put(nbytes)

    @property
    def failed(self) -> bool:
        """True once a unit has raised (long units may check it to stop early)."""
        return self._error is not None

    def _run(self, fn: Callable[..., None], args: tuple) -> None:
        try:
            if self._error is None:
                fn(*args)
        except BaseException as exc:  # every failure is handed to `wait`
            _detach(exc)
            with self._lock:
                if self._error is None:
                    self._error = exc
        finally:
            with self._lock:
                self._pending -= 1
                last = self._pending == 0
            if last:
                self._events.put(None)

    def wait(self, progress: Progress | None = None) -> None:
        """Run (inline) or wait for every unit; raise the first error."""
        try:
            if self._inline is not None:
                while self._inline:
                    self._run(*self._inline.pop(0))  # no local keeps a unit's arguments alive
                    self._drain(progress, block=False)
            else:
                with self._lock:
                    self._pending -= 1
                    idle = self._pending == 0
                if not idle:
                    self._drain(progress, block=True)
            self._drain(progress, block=False)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, OSError):
                raise CheckpointError(f"weight file I/O failed: {exc}") from exc
            raise exc

    def _drain(self, progress: Progress | None, block: bool) -> None:
        while True:
            try:
                item = self._events.get(block=block)
            except queue.Empty:
                return
            if item is None:
                return
            if progress is not None:
                progress(item)


def _detach(exc: BaseException) -> None:
    """Keep the worker's stack of `exc` (and of its causes) as text in a note, and drop its frames.

    A traceback's frames hold their locals and, through `f_back`, the worker's other frames: views
    of mapped files would outlive the failure (and the mappings with them).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            exc.add_note("raised in a weight-sync unit:\n" + "".join(traceback.format_tb(exc.__traceback__)))
            exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


class OrderedDigest:
    """The xxh3-128 of a tensor's bytes, fed step by step in order while steps finish in any order.

    `done(k)` marks step `k` (of `ranges`) as produced; the caller then hashes it and every later
    produced step, unless another thread is already hashing or an earlier step is missing. Returns
    True to exactly one caller: the one that hashed the last step (`hexdigest()` is then final).
    """

    def __init__(self, data: np.ndarray, ranges: list[tuple[int, int]]) -> None:
        self.data, self.ranges = data, ranges
        self._h = xxhash.xxh3_128()
        self._ready = [False] * len(ranges)
        self._next = 0
        self._busy = False
        self._lock = threading.Lock()

    def done(self, k: int, hot: np.ndarray | None = None) -> bool:
        """Mark step `k` produced; `hot`, if given, holds its bytes now (e.g. a scratch buffer in cache).

        Step `k` is hashed from `hot` if this call hashes it; a step hashed later comes from `data`.
        """
        with self._lock:
            self._ready[k] = True
            if self._busy:
                return False
            self._busy = True
        while True:
            with self._lock:
                i = self._next
                if i == len(self.ranges) or not self._ready[i]:
                    self._busy = False
                    return False
            lo, hi = self.ranges[i]
            self._h.update(hot if i == k and hot is not None else self.data[lo:hi])
            with self._lock:
                self._next = i + 1
                if self._next == len(self.ranges):
                    self._busy = False
                    return True

    def hexdigest(self) -> str:
        return self._h.hexdigest()
