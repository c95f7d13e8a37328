"""Delta versions: encode the change between two model states, and apply a delta to a full version.

Encodings, per changed tensor (unchanged tensors are omitted from the files, kept in the index):
- `xor`: the XOR of new and base. Sparse layout when few elements changed (positions, gap-encoded,
  and the XOR of each changed element), else dense (the whole XOR as independent zstd frames, one
  per 4 MiB chunk). Applying it twice restores the base: `rlgw.sync.pull` makes sure it is applied
  exactly once, to the base whose digest the index names.
- `overwrite`: the changed element positions (gap-encoded) and their new values, zstd-compressed.
  Idempotent, and smaller than xor when few elements change.

Encoding hashes the new bytes, then reads each changed tensor pair once, one cache-sized
`SCAN_BLOCK` at a time: each block pair is compared and its changed elements gathered while both
are in the core's cache (a dense xor, above `SPARSE_MAX`, takes a second pass to xor and compress).
Applying streams each tensor chunk by chunk through a per-thread scratch buffer (read, patch, hash,
write). Tensors run in parallel on a few threads (numpy, zstd and xxhash release the GIL).
`apply_delta` never touches its base: it writes a new full version into a directory the caller
publishes, checking the base version, every tensor's base digest before and its new digest after.
Versions, staging and engines are not this module's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.errors import CheckpointError, DigestMismatch, VersionError
from rlgw.sync.fileio import (
    CHUNK,
    Progress,
    default_workers,
    open_output,
    pread_into,
    pwrite_all,
    run_parallel,
    scratch,
    stream_tensor,
)
from rlgw.sync.full import NamedBytes
from rlgw.sync.stfile import DTYPE_SIZES, SafetensorsFile, write_file

ENCODINGS = ("xor", "overwrite")
# Bytes per step of the encoder's scan: a block of each state and its comparison mask stay in a
# core's 1 MiB L2 between the passes over them (compare, find, gather), so each byte comes from
# memory once. Larger blocks spill to L3; smaller ones add per-call overhead.
SCAN_BLOCK = 512 << 10
# Below this fraction of changed elements an xor tensor is stored sparse (positions + xor values):
# each change then costs about 4 + itemsize bytes before compression instead of a dense stream that
# zstd must scan (about 2 GB/s) and inflate (about 4 GB/s) in full.
SPARSE_MAX = 0.125
DELTA_FILE = "delta.safetensors"
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Tensors with this many elements or more store the gaps between changed positions as uint64.
WIDE_GAPS_FROM = 2**32


@dataclass(frozen=True, slots=True)
class TensorDelta:
    """The encoded change of one tensor: its new record and the compressed payload (None if unchanged)."""

    name: str
    record: ck.TensorRecord
    payload: bytes | None


def _wide(a: np.ndarray) -> np.ndarray:
    """The widest unsigned view of a uint8 chunk, for fast XOR."""
    return a.view(np.uint64) if a.size % 8 == 0 else a


def encode_tensor(
    new: NamedBytes, old: np.ndarray, base_digest: str, encoding: str, level: int = 1
) -> TensorDelta:
    """Encode the change from `old` (raw bytes with digest `base_digest`) to `new`."""
    if old.size != new.data.size:
        raise VersionError(f"{new.name}: base has {old.size} bytes, new state {new.data.size}")
    # The digest first, on its own: an unchanged tensor then costs one read of its new bytes
    # (hashing at about 20 GB/s), not a comparison with the base as well.
    new_digest = ck.digest(new.data)
    if new_digest == base_digest:
        rec = ck.TensorRecord(new.dtype, new.shape, new_digest, "unchanged", None, base_digest)
        return TensorDelta(new.name, rec, None)
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown delta encoding {encoding!r} (expected one of {ENCODINGS})")
    item = DTYPE_SIZES[new.dtype]
    numel = new.data.size // item
    # Overwrite is always sparse; xor is sparse below SPARSE_MAX of elements changed, else dense.
    limit = numel if encoding == "overwrite" else int(numel * SPARSE_MAX)
    changes = _changed(new.data, old, _UINT[item], limit, xor=encoding == "xor")
    cctx = zstd.ZstdCompressor(level=level, write_content_size=True)
    if changes is not None:
        idx, values = changes
        gaps = np.diff(idx, prepend=-1).astype(_UINT[_gap_width(numel)])
        payload, count, layout = cctx.compress(gaps.tobytes() + values.tobytes()), int(idx.size), "sparse"
    else:
        buf = scratch("xor")
        frames = []
        for pos in range(0, new.data.size, CHUNK):
            n = min(CHUNK, new.data.size - pos)
            out = buf[:n]
            np.bitwise_xor(_wide(new.data[pos : pos + n]), _wide(old[pos : pos + n]), out=_wide(out))
            frames.append(cctx.compress(out))
        payload, count, layout = b"".join(frames), 0, "dense"
    rec = ck.TensorRecord(
        new.dtype, new.shape, new_digest, encoding, DELTA_FILE, base_digest, len(payload), count, layout
    )
    return TensorDelta(new.name, rec, payload)


def _changed(
    new: np.ndarray, old: np.ndarray, uint: type, limit: int, xor: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """The elements where `new` and `old` (bytes) differ: `(positions, values)`, or None past `limit`.

    Values are `new ^ old` (`xor`) or `new` at each position. One pass, a `SCAN_BLOCK` at a time:
    each block pair is compared and its changed elements gathered while it is in cache, so each
    byte is read from memory once. Blocks are compared as 8-byte words and only the words that
    differ are split into elements: `np.flatnonzero` costs about a nanosecond per mask entry, and
    a word mask has a quarter (bf16) of an element mask's entries.
    """
    mask = scratch("mask", SCAN_BLOCK).view(bool)
    item = np.dtype(uint).itemsize
    positions: list[np.ndarray] = []
    values: list[np.ndarray] = []
    found = 0
    for pos in range(0, new.size, SCAN_BLOCK):
        nb, ob = new[pos : pos + SCAN_BLOCK], old[pos : pos + SCAN_BLOCK]
        # A block whose size is not a multiple of 8 (a tensor's last) is compared element by element.
        word = np.uint64 if nb.size % 8 == 0 else uint
        nw, ow = nb.view(word), ob.view(word)
        at = np.flatnonzero(np.not_equal(nw, ow, out=mask[: nw.size]))
        if at.size == 0:
            continue
        # Split the changed words into their elements (2**shift a word) and keep those that
        # differ; a bool mask keeps `flatnonzero` on numpy's fast path.
        shift = (np.dtype(word).itemsize // item).bit_length() - 1
        changed = nw[at]
        nv, xv = changed.view(uint), (changed ^ ow[at]).view(uint)
        sub = np.flatnonzero(xv != 0)
        found += sub.size
        if found > limit:
            return None
        positions.append(((at[sub >> shift] << shift) | (sub & ((1 << shift) - 1))) + pos // item)
        values.append((xv if xor else nv)[sub])
    if not positions:
        return np.empty(0, np.int64), np.empty(0, uint)
    return np.concatenate(positions), np.concatenate(values)


def write_delta_version(
    root: Path,
    version: int,
    base: ck.VersionIndex,
    pairs: Sequence[tuple[NamedBytes, np.ndarray]],
    encoding: str = "xor",
    *,
    level: int = 1,
    durable: bool = True,
    workers: int | None = None,
    progress: Progress | None = None,
) -> ck.VersionIndex:
    """Publish atomically the delta from the state described by `base` to the new tensors in `pairs`.

    `pairs` holds `(new, old_bytes)` for every tensor of the model; `old_bytes` must be the exact
    bytes `base` describes (their digests are recorded as the delta's base digests and checked).
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown delta encoding {encoding!r} (expected one of {ENCODINGS})")
    if version <= base.version:
        raise VersionError(f"delta v{version} must be newer than its base v{base.version}")
    names = [new.name for new, _ in pairs]
    if set(names) != set(base.tensors):
        missing, extra = set(base.tensors) - set(names), set(names) - set(base.tensors)
        raise VersionError(
            f"tensor set differs from base v{base.version}: "
            f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
        )

    def one(pair: tuple[NamedBytes, np.ndarray]) -> TensorDelta:
        new, old = pair
        return encode_tensor(new, old, base.tensors[new.name].digest, encoding, level)

    deltas = run_parallel(one, pairs, workers or default_workers(), progress, lambda p: p[0].data.size)
    with ck.atomic_dir(root / ck.version_dirname(version), durable=durable) as tmp:
        stored = [(d.name, "U8", (len(d.payload),), d.payload) for d in deltas if d.payload is not None]
        write_file(tmp / DELTA_FILE, stored, {"format": ck.FORMAT, "encoding": encoding}, fsync=durable)
        index = ck.VersionIndex(
            version, "delta", base.version, encoding, "zstd", {d.name: d.record for d in deltas}, [], CHUNK
        )
        ck.write_index(tmp, index)
    return index


class _XorPatch:
    """Streams a tensor's XOR frames into each chunk (`patch(chunk, pos)` for `stream_tensor`)."""

    def __init__(self, payload: memoryview) -> None:
        self.reader = zstd.ZstdDecompressor().stream_reader(payload, read_across_frames=True)

    def __call__(self, chunk: np.ndarray, pos: int) -> None:
        buf = scratch("xor", chunk.size)
        view = memoryview(buf).cast("B")
        got = 0
        while got < chunk.size:
            n = self.reader.readinto(view[got:])
            if n == 0:
                raise CheckpointError(f"delta payload ends at byte {pos + got}: truncated")
            got += n
        np.bitwise_xor(_wide(chunk), _wide(buf), out=_wide(chunk))

    def finish(self) -> None:
        if self.reader.read(1):
            raise CheckpointError("delta payload is longer than its tensor")


def _gap_width(numel: int) -> int:
    """Bytes per stored gap of a sparse payload: 4, or 8 for a tensor of `WIDE_GAPS_FROM` elements or more."""
    return 4 if numel < WIDE_GAPS_FROM else 8


class _SparsePatch:
    """Writes (overwrite) or XORs (sparse xor) a tensor's changed elements into each chunk."""

    def __init__(self, payload: memoryview, rec: ck.TensorRecord) -> None:
        self.xor = rec.encoding == "xor"
        item = DTYPE_SIZES[rec.dtype]
        numel = int(np.prod(rec.shape, dtype=np.int64))
        gw = _gap_width(numel)
        raw = zstd.ZstdDecompressor().decompress(payload, max_output_size=rec.count * (gw + item))
        if len(raw) != rec.count * (gw + item):
            raise CheckpointError(f"sparse payload has {len(raw)} bytes, expected {rec.count * (gw + item)}")
        gaps = np.frombuffer(raw, dtype=_UINT[gw], count=rec.count)
        if rec.count and gaps.min() < 1:
            raise CheckpointError("sparse payload has non-increasing positions")
        self.idx = np.cumsum(gaps, dtype=np.int64) - 1
        if rec.count and self.idx[-1] >= numel:
            raise CheckpointError(f"sparse position {self.idx[-1]} beyond {numel} elements")
        self.vals = np.frombuffer(raw, dtype=_UINT[item], offset=rec.count * gw)
        self.item = item

    def __call__(self, chunk: np.ndarray, pos: int) -> None:
        lo, hi = pos // self.item, (pos + chunk.size) // self.item
        a, b = np.searchsorted(self.idx, [lo, hi])
        view, at = chunk.view(self.vals.dtype), self.idx[a:b] - lo
        if self.xor:
            view[at] ^= self.vals[a:b]  # positions are unique, so fancy-index XOR is exact
        else:
            view[at] = self.vals[a:b]

    def finish(self) -> None:
        pass


def apply_delta(
    base_dir: Path,
    delta_dir: Path,
    out_dir: Path,
    workers: int | None = None,
    progress: Progress | None = None,
) -> ck.VersionIndex:
    """Write into the empty directory `out_dir` the full version that results from `delta_dir` on `base_dir`.

    Refuses (before writing anything) a delta whose base version or per-tensor base digests differ
    from `base_dir`, and fails with `DigestMismatch` if any patched tensor's digest differs from the
    delta's record. `base_dir` is only read. Returns the new full version's index (already written).
    """
    base, delta = ck.read_index(base_dir), ck.read_index(delta_dir)
    if base.kind != "full":
        raise CheckpointError(f"{base_dir}: base must be a full version")
    if delta.kind != "delta":
        raise CheckpointError(f"{delta_dir}: not a delta version")
    if delta.base_version != base.version:
        raise VersionError(
            f"delta v{delta.version} applies to v{delta.base_version}, "
            f"but the local checkpoint is v{base.version}"
        )
    if set(delta.tensors) != set(base.tensors):
        raise VersionError(f"delta v{delta.version} names other tensors than base v{base.version}")
    for name, rec in delta.tensors.items():
        b = base.tensors[name]
        if rec.base_digest != b.digest or (rec.dtype, rec.shape) != (b.dtype, b.shape):
            raise VersionError(
                f"wrong base for delta v{delta.version}: tensor {name!r} expects base digest "
                f"{rec.base_digest}, local v{base.version} has {b.digest}"
            )
        if rec.encoding == "unchanged" and rec.digest != b.digest:
            raise CheckpointError(f"{delta_dir}: unchanged tensor {name!r} with a new digest")
        if rec.encoding not in ("unchanged", "xor", "overwrite"):
            raise CheckpointError(f"{delta_dir}: unknown encoding {rec.encoding!r} for {name!r}")
        if rec.layout not in ("sparse", "dense") or (rec.layout == "dense" and rec.encoding != "xor"):
            raise CheckpointError(
                f"{delta_dir}: bad layout {rec.layout!r} for {rec.encoding} tensor {name!r}"
            )
    payloads = SafetensorsFile(delta_dir / DELTA_FILE)
    fds: list[int] = []
    try:
        jobs = []
        for name, rec in delta.tensors.items():
            if rec.encoding != "unchanged":
                e = payloads.entries.get(name)
                if e is None or e.nbytes != rec.stored:
                    raise CheckpointError(f"{delta_dir}: payload of {name!r} missing or of the wrong size")
        files: dict[str, list[str]] = {}
        for name, rec in base.tensors.items():
            files.setdefault(rec.file, []).append(name)
        for fname, names in files.items():
            sf = SafetensorsFile(base_dir / fname)
            try:
                src = os.open(base_dir / fname, os.O_RDONLY)
                fds.append(src)
                dst = open_output(out_dir / fname, os.fstat(src).st_size)
                fds.append(dst)
                head = np.empty(sf.data_start, dtype=np.uint8)
                pread_into(src, head, 0)
                pwrite_all(dst, head, 0)
                for name in names:
                    e = sf.entries[name]
                    jobs.append((name, src, dst, sf.data_start + e.start, e.nbytes))
            finally:
                sf.close()

        def one(job: tuple[str, int, int, int, int]) -> None:
            name, src, dst, off, n = job
            rec = delta.tensors[name]
            patch = None
            if rec.layout == "dense":
                patch = _XorPatch(payloads.raw(name))
            elif rec.encoding != "unchanged":
                patch = _SparsePatch(payloads.raw(name), rec)
            try:
                got = stream_tensor(src, off, n, dst, off, patch)
                if patch is not None:
                    patch.finish()
            except zstd.ZstdError as exc:
                raise CheckpointError(f"{delta_dir}: payload of {name!r} is corrupt ({exc})") from exc
            if got != rec.digest:
                raise DigestMismatch(
                    f"v{delta.version}: tensor {name!r} digest {got} after patch != recorded {rec.digest}"
                )

        run_parallel(one, jobs, workers or default_workers(), progress, lambda j: j[4])
    finally:
        for fd in fds:
            os.close(fd)
        payloads.close()
    ck.copy_aux_files(base_dir, out_dir, base.aux_files)
    records = {
        n: ck.TensorRecord(r.dtype, r.shape, delta.tensors[n].digest, "raw", r.file)
        for n, r in base.tensors.items()
    }
    index = ck.VersionIndex(delta.version, "full", delta.base_version, "raw", "none", records, base.aux_files)
    ck.write_index(out_dir, index)
    return index
