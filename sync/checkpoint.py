"""Versioned weight checkpoints on disk: naming, the index, digests, atomic publication, retention.

A version lives in `ROOT/weight_v{N:06d}/`, in Hugging Face safetensors layout: one or more
`*.safetensors` files plus `model.safetensors.index.json`, whose `weight_map` is the usual HF one and
whose `metadata` names the version, the kind (`full` or `delta`), the base version, the encoding
(`raw`, `xor`, `overwrite`), the compression (`none`, `zstd`) and the checksum (`xxh3-128`). The
index's `tensors` table records, for EVERY tensor of the model (changed or not), its dtype, shape and
the xxh3-128 digest of its full new bytes; delta entries also record the digest of the base bytes
they apply to. A full version also carries the model's non-weight files (config, tokenizer).

Publication is atomic: everything is written into a hidden temp directory beside the target, fsynced,
then renamed into place, so a reader sees a version completely or not at all.

This module does not encode or apply deltas (`rlgw.sync.delta`) nor talk to engines.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import xxhash
from typing_extensions import Buffer

from rlgw.sync.errors import CheckpointError, DigestMismatch, VersionError

FORMAT = "rlgw-weights/1"
CHECKSUM = "xxh3-128"
INDEX_NAME = "model.safetensors.index.json"
_DIR_RE = re.compile(r"^weight_v(\d{6,})$")
# Files of an HF checkpoint directory that are not weights and travel with every full version.
AUX_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".py", ".tiktoken")


def version_dirname(version: int) -> str:
    """`weight_v000042` for 42."""
    if version < 0:
        raise VersionError(f"version must be >= 0, got {version}")
    return f"weight_v{version:06d}"


def parse_version_dirname(name: str) -> int | None:
    """The version number of a `weight_vNNNNNN` directory name, or None for any other name."""
    m = _DIR_RE.match(name)
    return int(m.group(1)) if m else None


def digest(buf: Buffer) -> str:
    """xxh3-128 hex digest of `buf` (releases the GIL; about 10 GB/s here)."""
    return xxhash.xxh3_128(buf).hexdigest()


@dataclass(slots=True)
class TensorRecord:
    """One tensor in a version's index.

    `digest` is always the digest of the tensor's full bytes AFTER this version. In a delta,
    `encoding` is `unchanged` (no stored bytes; then `base_digest == digest`), `xor` or `overwrite`,
    `base_digest` names the bytes the patch must be applied to, `stored` is the compressed payload
    size, `count` the number of changed elements stored (sparse layout) and `layout` how an xor
    payload is laid out.
    """

    dtype: str
    shape: tuple[int, ...]
    digest: str
    encoding: str = "raw"
    file: str | None = None
    base_digest: str | None = None
    stored: int = 0
    count: int = 0
    layout: str = "sparse"  # xor only: "sparse" (positions + xor values) or "dense" (zstd frames)

    def to_json(self) -> dict:
        doc: dict = {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "digest": self.digest,
            "encoding": self.encoding,
        }
        if self.file is not None:
            doc["file"] = self.file
        if self.base_digest is not None:
            doc["base_digest"] = self.base_digest
        if self.encoding in ("xor", "overwrite"):
            doc["stored"] = self.stored
        if self.encoding in ("xor", "overwrite"):
            doc["count"] = self.count
            doc["layout"] = self.layout
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> TensorRecord:
        return cls(
            dtype=doc["dtype"],
            shape=tuple(int(d) for d in doc["shape"]),
            digest=doc["digest"],
            encoding=doc.get("encoding", "raw"),
            file=doc.get("file"),
            base_digest=doc.get("base_digest"),
            stored=int(doc.get("stored", 0)),
            count=int(doc.get("count", 0)),
            layout=doc.get("layout", "sparse"),
        )


@dataclass(slots=True)
class VersionIndex:
    """The parsed `model.safetensors.index.json` of one version."""

    version: int
    kind: str  # "full" or "delta"
    base_version: int | None
    encoding: str  # "raw" for full versions; "xor" or "overwrite" for deltas
    compression: str  # "none" or "zstd"
    tensors: dict[str, TensorRecord]
    aux_files: list[str] = field(default_factory=list)
    block_bytes: int = 0

    @property
    def checkpoint_digest(self) -> str:
        """xxh3-128 over every tensor's (name, digest), sorted: one value naming the whole state."""
        return combined_digest({n: r.digest for n, r in self.tensors.items()})

    @property
    def total_size(self) -> int:
        from rlgw.sync.stfile import nbytes_of

        return sum(nbytes_of(r.dtype, r.shape) for r in self.tensors.values())

    def to_json(self) -> bytes:
        meta = {
            "format": FORMAT,
            "version": self.version,
            "kind": self.kind,
            "base_version": self.base_version,
            "encoding": self.encoding,
            "compression": self.compression,
            "checksum": CHECKSUM,
            "checkpoint_digest": self.checkpoint_digest,
            "total_size": self.total_size,
            "block_bytes": self.block_bytes,
            "aux_files": self.aux_files,
        }
        weight_map = {n: r.file for n, r in self.tensors.items() if r.file is not None}
        tensors = {n: r.to_json() for n, r in self.tensors.items()}
        return orjson.dumps(
            {"metadata": meta, "weight_map": weight_map, "tensors": tensors}, option=orjson.OPT_INDENT_2
        )

    @classmethod
    def from_json(cls, raw: bytes, where: Path) -> VersionIndex:
        try:
            doc = orjson.loads(raw)
            meta = doc["metadata"]
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"{where}: not an rlgw weight index (format {meta.get('format')!r})")
            if meta.get("checksum") != CHECKSUM:
                raise CheckpointError(f"{where}: unsupported checksum {meta.get('checksum')!r}")
            index = cls(
                version=int(meta["version"]),
                kind=meta["kind"],
                base_version=None if meta.get("base_version") is None else int(meta["base_version"]),
                encoding=meta["encoding"],
                compression=meta["compression"],
                tensors={n: TensorRecord.from_json(t) for n, t in doc["tensors"].items()},
                aux_files=list(meta.get("aux_files", [])),
                block_bytes=int(meta.get("block_bytes", 0)),
            )
        except CheckpointError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{where}: malformed index ({exc!r})") from exc
        if index.kind not in ("full", "delta"):
            raise CheckpointError(f"{where}: unknown kind {index.kind!r}")
        if index.kind == "delta" and index.base_version is None:
            raise CheckpointError(f"{where}: delta without a base version")
        if meta.get("checkpoint_digest") != index.checkpoint_digest:
            raise DigestMismatch(f"{where}: index checkpoint_digest does not match its tensor digests")
        return index


def combined_digest(digests: dict[str, str]) -> str:
    """xxh3-128 over `name\\0digest\\n` lines in name order."""
    h = xxhash.xxh3_128()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\n".encode())
    return h.hexdigest()


def read_index(version_dir: Path) -> VersionIndex:
    """Parse and check the index of `version_dir`; raises CheckpointError if absent or malformed."""
    path = version_dir / INDEX_NAME
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{version_dir}: no readable index ({exc.strerror})") from exc
    index = VersionIndex.from_json(raw, path)
    expected = parse_version_dirname(version_dir.name)
    if expected is not None and expected != index.version:
        raise CheckpointError(f"{version_dir}: directory name says v{expected}, index says v{index.version}")
    return index


def write_index(version_dir: Path, index: VersionIndex) -> None:
    """Write the index file of `version_dir` and fsync it."""
    _write_synced(version_dir / INDEX_NAME, index.to_json())


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and new entries in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file in `path` (one level) and the directory itself."""
    for child in path.iterdir():
        if child.is_file():
            fd = os.open(child, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)


@contextlib.contextmanager
def atomic_dir(final: Path, durable: bool = True, recycle: Path | None = None) -> Iterator[Path]:
    """Yield a hidden temp directory beside `final`; on success fsync it and rename it to `final`.

    If the block raises, the temp directory is removed and `final` is untouched. An existing
    `final` is refused (versions are immutable once published). `recycle`, a retired version
    directory on the same filesystem, is renamed to be the temp directory (its index removed first),
    so that writers can overwrite its files' cached pages instead of faulting in fresh ones.
    """
    if final.exists():
        raise VersionError(f"{final} already exists; versions are immutable")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    if recycle is not None:
        os.rename(recycle, tmp)  # first, so that a crash never leaves a half-overwritten committed dir
        (tmp / INDEX_NAME).unlink(missing_ok=True)
    else:
        tmp.mkdir()
    try:
        yield tmp
        if recycle is not None:
            index = read_index(tmp)
            keep = {INDEX_NAME, *index.aux_files, *(r.file for r in index.tensors.values() if r.file)}
            for child in tmp.iterdir():
                if child.name not in keep:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        if durable:
            fsync_tree(tmp)
        os.rename(tmp, final)
        if durable:
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_aux_files(src: Path, dst: Path, names: list[str] | None = None) -> list[str]:
    """Copy the non-weight files of a checkpoint (config, tokenizer...) from `src` to `dst`."""
    if names is None:
        names = sorted(
            p.name
            for p in src.iterdir()
            if p.is_file() and p.name != INDEX_NAME and p.name.endswith(AUX_SUFFIXES)
        )
    for name in names:
        shutil.copyfile(src / name, dst / name)
    return names


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """A published version found under a root: number, kind, base and directory."""

    version: int
    kind: str
    base_version: int | None
    path: Path


def list_versions(root: Path) -> list[VersionInfo]:
    """Every complete version under `root`, in version order (temp and foreign dirs are ignored)."""
    found = []
    if not root.is_dir():
        return found
    for child in root.iterdir():
        v = parse_version_dirname(child.name)
        if v is None or not child.is_dir():
            continue
        index = read_index(child)
        found.append(VersionInfo(v, index.kind, index.base_version, child))
    return sorted(found, key=lambda i: i.version)


def gc_versions(root: Path, keep_full: int) -> list[Path]:
    """Apply retention: keep the newest `keep_full` full versions and the deltas after the newest full.

    Removes older full versions, every delta at or below the newest full version, and stale temp
    directories older than an hour. Returns the removed paths.
    """
    if keep_full < 1:
        raise ValueError("keep_full must be >= 1")
    versions = list_versions(root)
    fulls = [v for v in versions if v.kind == "full"]
    if not fulls:
        return []
    kept_full = {v.version for v in fulls[-keep_full:]}
    newest_full = fulls[-1].version
    removed = []
    for v in versions:
        drop = (v.kind == "full" and v.version not in kept_full) or (
            v.kind == "delta" and v.version <= newest_full
        )
        if drop:
            shutil.rmtree(v.path)
            removed.append(v.path)
    for child in root.iterdir():
        # A temp dir younger than an hour may belong to a publish in progress right now.
        if child.name.startswith(".tmp-weight_v") and time.time() - child.stat().st_mtime > 3600:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    if removed:
        fsync_dir(root)
    return removed
