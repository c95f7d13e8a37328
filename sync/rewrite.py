"""Write a full version's files from another full version's files, tensor by tensor, on threads.

`rewrite` maps each safetensors file of the source read-only and, with an output directory, a
same-sized output file writable (`OutputMap`). Every tensor is split into segments that threads pick
up (`rlgw.sync.parallel`); each step of a segment is copied from the source mapping to the output
mapping, patched if the tensor has a `Patch`, and hashed in order while still in cache; the
tensor's digest must then equal the expected one. Without an output directory the source bytes are
only hashed (verification in place). Nothing is read into Python objects and nothing is copied twice.

`apply_delta` (patches decoded from a delta) and `copy_verified` (no patches) use it; it knows no
encodings and does not publish anything (the caller renames the output directory into place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rlgw.sync.fileio import OutputMap
from rlgw.sync.parallel import OrderedDigest, Pool, Progress, segments, steps
from rlgw.sync.stfile import SafetensorsFile


class Patch(Protocol):
    """Turns a tensor's source bytes into its new bytes, one step at a time."""

    # True when steps must be produced in order by one thread (a compressed stream).
    sequential: bool

    def __call__(self, out: np.ndarray, src: np.ndarray, pos: int) -> None:
        """Write into `out` the new bytes of the step at tensor offset `pos`, whose source is `src`."""

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
    maps: list[tuple[SafetensorsFile, OutputMap | None]] = []
    views: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    pool = Pool(workers)
    try:
        for fname in dict.fromkeys(t.file for t in targets):
            sf = SafetensorsFile(src_dir / fname)
            maps.append((sf, None))
            src = np.frombuffer(sf.buffer(), dtype=np.uint8)
            out = None
            if dst_dir is not None:
                out = OutputMap(dst_dir / fname, src.size)
                maps[-1] = (sf, out)
                out.array[: sf.data_start] = src[: sf.data_start]
            views[fname] = (src, None if out is None else out.array)
        for t in targets:
            src, out = views[t.file]
            end = t.start + t.nbytes
            _Tensor(pool, t, src[t.start : end], None if out is None else out[t.start : end], mismatch)
        views.clear()
        src = out = None
        pool.wait(progress)
    finally:
        # Every view goes before its mapping (an error's traceback holds this frame): nothing stays mapped.
        views.clear()
        src = out = None
        for sf, out in maps:
            if out is not None:
                out.close()
            sf.close()


class _Tensor:
    """One target's units: one per segment, or a single one for a sequential patch.

    Units are bound methods, never closures: a failed unit's frames are cleared (`Pool.wait`), and
    a closure would keep the mapped views alive through its cells.
    """

    def __init__(
        self,
        pool: Pool,
        t: Target,
        src: np.ndarray,
        out: np.ndarray | None,
        mismatch: Callable[[str, str], Exception],
    ) -> None:
        self.pool, self.t, self.src, self.out, self.mismatch = pool, t, src, out, mismatch
        ranges = [s for lo, hi in segments(t.nbytes) for s in steps(lo, hi)] or [(0, 0)]
        self.digest = OrderedDigest(src if out is None else out, ranges)
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
        src, out = self.src, self.out
        k = self.first_step[lo]
        for a, b in steps(lo, hi) or [(lo, hi)]:
            if out is not None:
                if patch is None:
                    np.copyto(out[a:b], src[a:b])
                else:
                    patch(out[a:b], src[a:b], a)
            self.pool.report(b - a)
            if self.digest.done(k) and self.digest.hexdigest() != self.t.digest:
                raise self.mismatch(self.t.name, self.digest.hexdigest())
            k += 1
