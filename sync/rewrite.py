"""Write a full version's files from another full version's files, tensor by tensor, on threads.

`rewrite` maps each safetensors file of the source read-only and writes a same-sized output file
with `pwrite` (a shared writable mapping was measured slower here: every page faults through
ext4's page_mkwrite, and two threads faulting in one process stall each other). Every tensor is
split into segments that threads pick up (`rlgw.sync.parallel`); each step of a segment is patched
if the tensor has a `Patch` (into a per-thread scratch buffer) or else written straight from the
source mapping, and hashed in order while still in cache; the tensor's digest must then equal the
expected one. A step whose turn to be hashed comes later is hashed from the output file's page
cache (mapped read-only) instead. Without an output directory the source bytes are only hashed
(verification in place). Nothing is read into Python objects.

`apply_delta` (patches decoded from a delta) and `copy_verified` (no patches) use it; it knows no
encodings and does not publish anything (the caller renames the output directory into place).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rlgw.sync.errors import CheckpointError
from rlgw.sync.fileio import open_output, pwrite_all
from rlgw.sync.parallel import OrderedDigest, Pool, Progress, segments, steps
from rlgw.sync.stfile import SafetensorsFile


class Patch(Protocol):
    """Turns a tensor's source bytes into its new bytes, one step at a time."""

    # True when steps must be produced in order by one thread (a compressed stream, or buffers
    # that live in one thread's scratch).
    sequential: bool

    def __call__(self, src: np.ndarray, pos: int) -> np.ndarray:
        """The new bytes of the step at tensor offset `pos` whose source bytes are `src`.

        The result may be this thread's scratch buffer: valid until the thread's next call.
        """

    def finish(self) -> None:
        """Check, after the last step, that the patch was consumed exactly."""


@dataclass(frozen=True, slots=True)
class Target:
    """One tensor to rewrite: where it lies in the source file and what its new bytes must hash to."""

    name: str
    file: str
    start: int  # byte offset in the file (header included)
    nbytes: int
    digest: str
    # Builds the tensor's patch (run on a worker: decoding may be heavy); None: copied as it is.
    patch: Callable[[], Patch] | None = None


class _File:
    """A source file mapped read-only and, when writing, its output twin (fd, and a read-only map)."""

    def __init__(self, src: Path, dst: Path | None) -> None:
        self.sf = SafetensorsFile(src)
        self.fd: int | None = None
        self._out_mm: mmap.mmap | None = None
        self.src = np.frombuffer(self.sf.buffer(), dtype=np.uint8)
        self.out: np.ndarray | None = None
        if dst is not None:
            try:
                self.fd = open_output(dst, self.src.size)
                pwrite_all(self.fd, self.src[: self.sf.data_start], 0)
                self._out_mm = mmap.mmap(self.fd, self.src.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            except OSError as exc:
                self.close()
                raise CheckpointError(f"{dst}: cannot write ({exc})") from exc
            self.out = np.frombuffer(self._out_mm, dtype=np.uint8)

    def close(self) -> None:
        """Drop the views, then unmap and close (a view alive elsewhere keeps its map until collected)."""
        self.src = self.out = None
        if self._out_mm is not None:
            try:
                self._out_mm.close()
            except BufferError:
                pass
        if self.fd is not None:
            os.close(self.fd)
        self.sf.close()


def rewrite(
    src_dir: Path,
    targets: list[Target],
    dst_dir: Path | None,
    mismatch: Callable[[str, str], Exception],
    workers: int,
    progress: Progress | None = None,
) -> None:
    """Write (or, with `dst_dir=None`, only hash) every target; raise `mismatch(name, digest)` on a bad one.

    Every source file named by a target is mapped; its output twin has the same size and the same
    header. Targets must cover every data byte of the files that are written.
    """
    files: dict[str, _File] = {}
    pool = Pool(workers)
    try:
        for t in targets:
            if t.file not in files:
                files[t.file] = _File(src_dir / t.file, None if dst_dir is None else dst_dir / t.file)
            _Tensor(pool, t, files[t.file], mismatch)
        pool.wait(progress)
    finally:
        for f in files.values():
            f.close()


class _Tensor:
    """One target's units: one per segment, or a single one for a sequential patch.

    Units are bound methods holding no view themselves (the views live in `_File`, dropped on
    close): a failed unit's frames go with its error (`Pool`), and nothing keeps a map alive.
    """

    def __init__(self, pool: Pool, t: Target, f: _File, mismatch: Callable[[str, str], Exception]) -> None:
        self.pool, self.t, self.f, self.mismatch = pool, t, f, mismatch
        ranges = [s for lo, hi in segments(t.nbytes) for s in steps(lo, hi)] or [(0, 0)]
        # What a late step is hashed from: the output's page cache, or the source when only verifying.
        data = f.src if f.out is None or t.patch is None else f.out
        self.digest = OrderedDigest(data[t.start : t.start + t.nbytes], ranges)
        self.first_step = {lo: k for k, (lo, _) in enumerate(ranges)}
        if t.patch is None:
            for lo, hi in segments(t.nbytes):
                pool.submit(self._run, None, lo, hi)
        else:
            pool.submit(self._start)

    def _start(self) -> None:
        patch = self.t.patch()
        if patch.sequential:
            self._run(patch, 0, self.t.nbytes)
            patch.finish()
            return
        for lo, hi in segments(self.t.nbytes):
            self.pool.submit(self._run, patch, lo, hi)

    def _run(self, patch: Patch | None, lo: int, hi: int) -> None:
        f, start = self.f, self.t.start
        k = self.first_step[lo]
        for a, b in steps(lo, hi) or [(lo, hi)]:
            src = f.src[start + a : start + b]
            new = src if patch is None else patch(src, a)
            if f.fd is not None:
                pwrite_all(f.fd, new, start + a)
            self.pool.report(b - a)
            if self.digest.done(k, new) and self.digest.hexdigest() != self.t.digest:
                raise self.mismatch(self.t.name, self.digest.hexdigest())
            k += 1
