"""Delta versions: encode the change between two model states, and apply a delta to a full version.

Encodings, per changed tensor (unchanged tensors are omitted from the files, kept in the index):
- `xor`: the XOR of new and base. Sparse layout when few elements changed (positions, gap-encoded,
  and the XOR of each changed element), else dense (the whole XOR as independent zstd frames, one
  per 4 MiB chunk). Applying it twice restores the base: `rlgw.sync.pull` makes sure it is applied
  exactly once, to the base whose digest the index names.
- `overwrite`: the changed element positions (gap-encoded) and their new values, zstd-compressed.
  Idempotent, and smaller than xor when few elements change.

Both run in segments on a few threads (`rlgw.sync.parallel`; numpy, zstd and xxhash release the
GIL): encoding compares each step of new and base 8 bytes at a time and hashes it in order while it
is in cache; the dense frames are compressed in parallel. Applying writes the new full version
through `rlgw.sync.rewrite` (the base mapped, each step patched in cache and written once).
`apply_delta` never touches its base: it writes a new full version into a directory the caller
publishes, checking the base version, every tensor's base digest before and its new digest after.
Versions, staging and engines are not this module's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.errors import CheckpointError, DigestMismatch, VersionError
from rlgw.sync.fileio import CHUNK, default_workers, scratch
from rlgw.sync.full import NamedBytes
from rlgw.sync.parallel import OrderedDigest, Pool, Progress, segments, steps
from rlgw.sync.rewrite import Target, rewrite
from rlgw.sync.stfile import DTYPE_SIZES, SafetensorsFile, write_file

ENCODINGS = ("xor", "overwrite")
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


def _changes(new: np.ndarray, old: np.ndarray, item: int, xor: bool) -> tuple[np.ndarray, np.ndarray]:
    """(element positions where the uint8 chunks differ, their XOR or new values), for `item`-byte elements.

    Compares 8 bytes at a time (one flag per word, a fraction of the element count) and looks at
    the elements only inside the words that differ: at 1% of bf16 elements changed that is 4% of
    the words. A chunk whose size is not a multiple of 8 (a tensor's last) ends element by element.
    """
    ui = _UINT[item]
    n8 = new.size - new.size % 8
    a, b = new[:n8].view(np.uint64), old[:n8].view(np.uint64)
    flags = scratch("flags", a.size + 8)[: a.size + (-a.size % 8)].view(np.bool_)
    flags[a.size :] = False
    np.not_equal(a, b, out=flags[: a.size])
    pos, vals = [np.empty(0, np.int64)], [np.empty(0, ui)]
    if np.count_nonzero(flags):
        w = _flagged(flags)
        shift = (8 // item).bit_length() - 1  # log2 of the elements per word
        aw = a[w]
        x = (aw ^ b[w]).view(ui)
        j = np.flatnonzero(x != 0)
        pos.append((w[j >> shift] << shift) | (j & ((1 << shift) - 1)))
        vals.append(x[j] if xor else aw.view(ui)[j])
    if n8 < new.size:
        tn, to = new[n8:].view(ui), old[n8:].view(ui)
        j = np.flatnonzero(tn != to)
        pos.append(j + n8 // item)
        vals.append((tn[j] ^ to[j]) if xor else tn[j])
    if len(pos) == 2:
        return pos[1], vals[1]
    return np.concatenate(pos), np.concatenate(vals)


def _flagged(flags: np.ndarray) -> np.ndarray:
    """`np.flatnonzero(flags)` for a bool array whose size is a multiple of 8, in two levels.

    numpy scans a bool array for nonzero at about one element per ns; looking at 8 flags at a time
    first (one uint64 each) and then only inside the groups that have one costs about half.
    """
    words = flags.view(np.uint64)
    groups = np.flatnonzero(words)
    inner = np.flatnonzero(words[groups].view(np.bool_))
    return (groups[inner >> 3] << 3) | (inner & 7)


_compressors = threading.local()


def _compressor(level: int) -> zstd.ZstdCompressor:
    """This thread's zstd compressor for `level` (a compressor must not be shared between threads)."""
    cache = _compressors.__dict__.setdefault("by_level", {})
    if level not in cache:
        cache[level] = zstd.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


class _Encoder:
    """One tensor's encode as pool units: compare and hash each segment, then store it sparse or dense.

    Segments are compared on any thread; steps are hashed in order (`OrderedDigest`); the thread that
    hashes the last step finishes the tensor: unchanged (same digest), sparse (positions and
    values, one zstd frame), or dense, whose XOR frames are then compressed as units of their own.
    Once more than `limit` elements changed the comparing stops (only hashing goes on).
    """

    def __init__(
        self, pool: Pool, new: NamedBytes, old: np.ndarray, base_digest: str, encoding: str, level: int
    ) -> None:
        if old.size != new.data.size:
            raise VersionError(f"{new.name}: base has {old.size} bytes, new state {new.data.size}")
        self.pool, self.new, self.old = pool, new, old
        self.base_digest, self.encoding, self.level = base_digest, encoding, level
        self.item = DTYPE_SIZES[new.dtype]
        numel = new.data.size // self.item
        # Overwrite is always sparse; xor is sparse below SPARSE_MAX of elements changed, else dense.
        self.limit = numel if encoding == "overwrite" else int(numel * SPARSE_MAX)
        self.numel = numel
        self.found = 0
        self.dense = False
        self.lock = threading.Lock()
        ranges = [s for lo, hi in segments(new.data.size) for s in steps(lo, hi)] or [(0, 0)]
        self.first_step = {lo: k for k, (lo, _) in enumerate(ranges)}
        self.parts: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(ranges)
        self.digest = OrderedDigest(new.data, ranges)
        self.frames: list[bytes] = []
        self.frames_left = 0
        self.result: TensorDelta | None = None
        for lo, hi in segments(new.data.size):
            pool.submit(self._segment, lo, hi)

    def _segment(self, lo: int, hi: int) -> None:
        k = self.first_step[lo]
        xor = self.encoding != "overwrite"
        for a, b in steps(lo, hi) or [(lo, hi)]:
            if not self.dense:
                pos, vals = _changes(self.new.data[a:b], self.old[a:b], self.item, xor)
                self.parts[k] = (pos + a // self.item, vals)
                with self.lock:
                    self.found += pos.size
                    self.dense = self.found > self.limit
            self.pool.report(b - a)
            if self.digest.done(k):
                self._finish()
            k += 1

    def _record(self, payload: bytes, count: int, layout: str) -> None:
        n = self.new
        rec = ck.TensorRecord(
            n.dtype, n.shape, self.digest.hexdigest(), self.encoding, DELTA_FILE,
            self.base_digest, len(payload), count, layout,
        )  # fmt: skip
        self.result = TensorDelta(n.name, rec, payload)

    def _finish(self) -> None:
        n, digest = self.new, self.digest.hexdigest()
        if digest == self.base_digest:
            rec = ck.TensorRecord(n.dtype, n.shape, digest, "unchanged", None, self.base_digest)
            self.result = TensorDelta(n.name, rec, None)
            return
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown delta encoding {self.encoding!r} (expected one of {ENCODINGS})")
        if not self.dense:
            self._record(self._sparse_payload(), self.found, "sparse")
            return
        nframes = -(-n.data.size // CHUNK)
        self.frames, self.frames_left = [b""] * nframes, nframes
        for i in range(nframes):
            self.pool.submit(self._frame, i)

    def _sparse_payload(self) -> bytes:
        """Gaps between changed positions (uint32, or uint64 for huge tensors), then the values."""
        gw, count = _gap_width(self.numel), self.found
        raw = np.empty(count * (gw + self.item), dtype=np.uint8)
        gaps, values = raw[: count * gw].view(_UINT[gw]), raw[count * gw :].view(_UINT[self.item])
        at, prev = 0, -1
        for pos, vals in self.parts:
            if pos.size:
                gaps[at : at + pos.size] = np.diff(pos, prepend=prev)
                values[at : at + pos.size] = vals
                at, prev = at + pos.size, int(pos[-1])
        return _compressor(self.level).compress(raw)

    def _frame(self, i: int) -> None:
        lo = i * CHUNK
        n = min(CHUNK, self.new.data.size - lo)
        out = scratch("xor", n)
        np.bitwise_xor(_wide(self.new.data[lo : lo + n]), _wide(self.old[lo : lo + n]), out=_wide(out))
        self.frames[i] = _compressor(self.level).compress(out)
        with self.lock:
            self.frames_left -= 1
            last = self.frames_left == 0
        if last:
            self._record(b"".join(self.frames), 0, "dense")


def encode_tensor(
    new: NamedBytes, old: np.ndarray, base_digest: str, encoding: str, level: int = 1
) -> TensorDelta:
    """Encode the change from `old` (raw bytes with digest `base_digest`) to `new`, on this thread."""
    pool = Pool(1)
    enc = _Encoder(pool, new, old, base_digest, encoding, level)
    pool.wait()
    return enc.result


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
    bytes `base` describes (their digests are recorded as the delta's base digests; applying the
    delta checks them).
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
    for new, old in pairs:
        if old.size != new.data.size:
            raise VersionError(f"{new.name}: base has {old.size} bytes, new state {new.data.size}")
    pool = Pool(workers or default_workers())
    # Biggest first, so that the last units to run are small ones and no thread idles at the end.
    order = sorted(range(len(pairs)), key=lambda i: -pairs[i][0].data.size)
    encoders: list[_Encoder | None] = [None] * len(pairs)
    for i in order:
        new, old = pairs[i]
        encoders[i] = _Encoder(pool, new, old, base.tensors[new.name].digest, encoding, level)
    pool.wait(progress)
    deltas = [e.result for e in encoders]
    with ck.atomic_dir(root / ck.version_dirname(version), durable=durable) as tmp:
        stored = [(d.name, "U8", (len(d.payload),), d.payload) for d in deltas if d.payload is not None]
        write_file(tmp / DELTA_FILE, stored, {"format": ck.FORMAT, "encoding": encoding}, fsync=durable)
        index = ck.VersionIndex(
            version, "delta", base.version, encoding, "zstd", {d.name: d.record for d in deltas}, [], CHUNK
        )
        ck.write_index(tmp, index)
    return index


def _fill(reader: zstd.ZstdDecompressionReader, buf: np.ndarray, where: str) -> int:
    """Decompress into `buf` until it is full or the stream ends; returns the bytes written."""
    view = memoryview(buf).cast("B")
    got = 0
    try:
        while got < len(view):
            n = reader.readinto(view[got:])
            if n == 0:
                break
            got += n
    except zstd.ZstdError as exc:
        raise CheckpointError(f"{where} is corrupt ({exc})") from exc
    return got


def _at_end(reader: zstd.ZstdDecompressionReader, where: str) -> bool:
    try:
        return not reader.read(1)
    except zstd.ZstdError as exc:
        raise CheckpointError(f"{where} is corrupt ({exc})") from exc


class _XorPatch:
    """XORs a tensor's dense XOR stream (zstd frames, read in order) into each step."""

    sequential = True

    def __init__(self, payload: memoryview, where: str) -> None:
        self.where = where
        self.reader = zstd.ZstdDecompressor().stream_reader(payload, read_across_frames=True)

    def __call__(self, src: np.ndarray, pos: int) -> np.ndarray:
        buf = scratch("xor", src.size)
        got = _fill(self.reader, buf, self.where)
        if got < src.size:
            raise CheckpointError(f"delta payload ends at byte {pos + got}: truncated")
        np.bitwise_xor(_wide(src), _wide(buf), out=_wide(buf))
        return buf

    def finish(self) -> None:
        if not _at_end(self.reader, self.where):
            raise CheckpointError("delta payload is longer than its tensor")


def _gap_width(numel: int) -> int:
    """Bytes per stored gap of a sparse payload: 4, or 8 for a tensor of `WIDE_GAPS_FROM` elements or more."""
    return 4 if numel < WIDE_GAPS_FROM else 8


class _SparsePatch:
    """Copies each step and writes (overwrite) or XORs (sparse xor) the tensor's changed elements into it.

    A tensor of one segment is patched by one unit (`sequential`), so its decoded positions and
    values live in that thread's scratch buffers: no fresh memory per tensor (fresh pages cost a
    fault each here, and a munmap stalls the other threads). A bigger tensor's patch is
    shared by its segments' units and owns its arrays.
    """

    def __init__(self, payload: memoryview, rec: ck.TensorRecord, where: str) -> None:
        self.xor = rec.encoding == "xor"
        item = DTYPE_SIZES[rec.dtype]
        numel = int(np.prod(rec.shape, dtype=np.int64))
        self.sequential = len(segments(numel * item)) == 1
        gw = _gap_width(numel)
        size = rec.count * (gw + item)
        if self.sequential:
            raw, idx = scratch("sparse", size), scratch("sparse-idx", rec.count * 8).view(np.int64)
        else:
            raw, idx = np.empty(size, np.uint8), np.empty(rec.count, np.int64)
        reader = zstd.ZstdDecompressor().stream_reader(payload, read_across_frames=True)
        got = _fill(reader, raw, where)
        if got < size or not _at_end(reader, where):
            raise CheckpointError(
                f"sparse payload has {got if got < size else 'more than ' + str(size)} bytes, expected {size}"
            )
        gaps = raw[: rec.count * gw].view(_UINT[gw])
        if rec.count and gaps.min() < 1:
            raise CheckpointError("sparse payload has non-increasing positions")
        self.idx = np.cumsum(gaps, dtype=np.int64, out=idx)
        self.idx -= 1
        if rec.count and self.idx[-1] >= numel:
            raise CheckpointError(f"sparse position {self.idx[-1]} beyond {numel} elements")
        self.vals = raw[rec.count * gw :].view(_UINT[item])
        self.item = item

    def __call__(self, src: np.ndarray, pos: int) -> np.ndarray:
        out = scratch("step", src.size)
        np.copyto(out, src)
        lo, hi = pos // self.item, (pos + out.size) // self.item
        a, b = np.searchsorted(self.idx, [lo, hi])
        view, at = out.view(self.vals.dtype), self.idx[a:b] - lo
        if self.xor:
            view[at] ^= self.vals[a:b]  # positions are unique, so fancy-index XOR is exact
        else:
            view[at] = self.vals[a:b]
        return out

    def finish(self) -> None:
        pass


def _check_delta(base: ck.VersionIndex, delta: ck.VersionIndex, delta_dir: Path) -> None:
    """Refuse a delta that does not apply to `base` or whose index is inconsistent."""
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
    _check_delta(base, delta, delta_dir)
    payloads = SafetensorsFile(delta_dir / DELTA_FILE)
    try:
        for name, rec in delta.tensors.items():
            if rec.encoding != "unchanged":
                e = payloads.entries.get(name)
                if e is None or e.nbytes != rec.stored:
                    raise CheckpointError(f"{delta_dir}: payload of {name!r} missing or of the wrong size")
        targets = []
        for fname in dict.fromkeys(r.file for r in base.tensors.values()):
            with SafetensorsFile(base_dir / fname) as sf:
                entries, start = sf.entries, sf.data_start
            for name, e in entries.items():
                rec = delta.tensors[name]
                targets.append(
                    Target(
                        name,
                        fname,
                        start + e.start,
                        e.nbytes,
                        rec.digest,
                        _patch(payloads, name, rec, delta_dir),
                    )
                )

        def mismatch(name: str, got: str) -> DigestMismatch:
            return DigestMismatch(
                f"v{delta.version}: tensor {name!r} digest {got} after patch "
                f"!= recorded {delta.tensors[name].digest}"
            )

        rewrite(base_dir, targets, out_dir, mismatch, workers or default_workers(), progress)
    finally:
        payloads.close()
    ck.copy_aux_files(base_dir, out_dir, base.aux_files)
    records = {
        n: ck.TensorRecord(r.dtype, r.shape, delta.tensors[n].digest, "raw", r.file)
        for n, r in base.tensors.items()
    }
    index = ck.VersionIndex(delta.version, "full", delta.base_version, "raw", "none", records, base.aux_files)
    ck.write_index(out_dir, index)
    return index


def _patch(payloads: SafetensorsFile, name: str, rec: ck.TensorRecord, delta_dir: Path):
    """The patch factory of one tensor of a delta (None for an unchanged one)."""
    where = f"{delta_dir}: payload of {name!r}"
    if rec.encoding == "unchanged":
        return None
    if rec.layout == "dense":
        return lambda: _XorPatch(payloads.raw(name), where)
    return lambda: _SparsePatch(payloads.raw(name), rec, where)
