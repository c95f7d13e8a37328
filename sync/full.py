"""Full versions: write one from in-memory tensors, verify one, copy one with verification.

Full disk sync is: the trainer calls `write_full_version`; each engine host either verifies the
shared directory in place (`verify_version`) or pulls it into a host-local directory with
`copy_verified` (every byte hashed on the way, so a stale mount or torn copy is caught), then the
engine reloads from the verified directory. This module does not talk to engines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlgw.sync import checkpoint as ck
from rlgw.sync.errors import CheckpointError, DigestMismatch
from rlgw.sync.fileio import (
    Progress,
    default_workers,
    open_output,
    pread_into,
    pwrite_all,
    run_parallel,
    stream_tensor,
)
from rlgw.sync.stfile import SafetensorsFile, build_header, nbytes_of

DEFAULT_SHARD_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class NamedBytes:
    """A tensor as raw bytes: safetensors dtype name, shape and a flat uint8 array (zero-copy view)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        if self.data.dtype != np.uint8 or self.data.ndim != 1:
            raise ValueError(f"{self.name}: data must be a flat uint8 array")
        if self.data.size != nbytes_of(self.dtype, self.shape):
            raise ValueError(f"{self.name}: {self.data.size} bytes for {self.dtype}{list(self.shape)}")


def plan_shards(sizes: Sequence[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    """Group tensor names, in order, into shards of at most `shard_bytes` (one tensor may exceed it)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_name(i: int, n: int) -> str:
    """HF shard file naming: `model.safetensors`, or `model-00001-of-00003.safetensors`."""
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_full_version(
    root: Path,
    version: int,
    tensors: Sequence[NamedBytes],
    *,
    aux_src: Path | None = None,
    base_version: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    durable: bool = True,
    workers: int | None = None,
    progress: Progress | None = None,
) -> ck.VersionIndex:
    """Publish `tensors` atomically as the full version `root/weight_v{version}`; returns its index.

    Non-weight files (config, tokenizer) are copied from `aux_src` when given.
    """
    by_name = {t.name: t for t in tensors}
    if len(by_name) != len(tensors):
        raise ValueError("duplicate tensor names")
    shards = plan_shards([(t.name, t.data.size) for t in tensors], shard_bytes)
    records: dict[str, ck.TensorRecord] = {}
    with ck.atomic_dir(root / ck.version_dirname(version), durable=durable) as tmp:
        jobs = []
        fds = []
        try:
            for i, names in enumerate(shards):
                fname = shard_name(i, len(shards))
                header = build_header(
                    [(n, by_name[n].dtype, by_name[n].shape, by_name[n].data.size) for n in names], None
                )
                fd = os.open(tmp / fname, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                fds.append(fd)
                pwrite_all(fd, header, 0)
                off = len(header)
                for n in names:
                    jobs.append((fd, off, by_name[n], fname))
                    off += by_name[n].data.size
                os.ftruncate(fd, off)

            def write_one(job: tuple[int, int, NamedBytes, str]) -> tuple[str, ck.TensorRecord]:
                fd, off, t, fname = job
                pwrite_all(fd, t.data, off)
                return t.name, ck.TensorRecord(t.dtype, t.shape, ck.digest(t.data), "raw", fname)

            records = dict(
                run_parallel(
                    write_one, jobs, workers or default_workers(), progress, lambda j: j[2].data.size
                )
            )
        finally:
            for fd in fds:
                os.close(fd)
        aux = ck.copy_aux_files(aux_src, tmp) if aux_src is not None else []
        index = ck.VersionIndex(
            version, "full", base_version, "raw", "none", {t.name: records[t.name] for t in tensors}, aux
        )
        ck.write_index(tmp, index)
    return index


def _check_full(index: ck.VersionIndex, where: Path) -> None:
    if index.kind != "full":
        raise CheckpointError(f"{where}: v{index.version} is a {index.kind} version, not a full one")


def copy_verified(
    src: Path, dst: Path | None, workers: int | None = None, progress: Progress | None = None
) -> ck.VersionIndex:
    """Hash every tensor of the full version `src` against its index, copying it to `dst` when given.

    `dst` must not exist yet; the caller publishes it (rename) once this returns. Raises
    `DigestMismatch` or `CheckpointError` on the first bad tensor or file.
    """
    index = ck.read_index(src)
    _check_full(index, src)
    files: dict[str, list[str]] = {}
    for name, rec in index.tensors.items():
        if rec.file is None:
            raise CheckpointError(f"{src}: tensor {name!r} has no file in the weight map")
        files.setdefault(rec.file, []).append(name)
    jobs = []
    opened: list[tuple[SafetensorsFile, int, int | None]] = []
    try:
        for fname, names in files.items():
            sf = SafetensorsFile(src / fname)
            src_fd = os.open(src / fname, os.O_RDONLY)
            dst_fd = None
            if dst is not None:
                dst_fd = open_output(dst / fname, os.fstat(src_fd).st_size)
            opened.append((sf, src_fd, dst_fd))
            if set(names) != set(sf.entries):
                raise CheckpointError(f"{src / fname}: tensors differ from the index's weight map")
            if dst_fd is not None:
                head = np.empty(sf.data_start, dtype=np.uint8)
                pread_into(src_fd, head, 0)
                pwrite_all(dst_fd, head, 0)
            for name in names:
                e, rec = sf.entries[name], index.tensors[name]
                if e.dtype != rec.dtype or e.shape != rec.shape:
                    raise CheckpointError(f"{src / fname}: {name!r} is {e.dtype}{list(e.shape)} in the file")
                jobs.append((name, src_fd, sf.data_start + e.start, e.nbytes, dst_fd))

        def one(job: tuple[str, int, int, int, int | None]) -> None:
            name, sfd, off, n, dfd = job
            got = stream_tensor(sfd, off, n, dfd, off)
            if got != index.tensors[name].digest:
                raise DigestMismatch(
                    f"{src}: tensor {name!r} digest {got} != recorded {index.tensors[name].digest}"
                )

        run_parallel(one, jobs, workers or default_workers(), progress, lambda j: j[3])
    finally:
        for sf, sfd, dfd in opened:
            sf.close()
            os.close(sfd)
            if dfd is not None:
                os.close(dfd)
    if dst is not None:
        ck.copy_aux_files(src, dst, index.aux_files)
        ck.write_index(dst, index)
    return index


def verify_version(
    path: Path, workers: int | None = None, progress: Progress | None = None
) -> ck.VersionIndex:
    """Hash every tensor of the full version at `path` against its index (no copy)."""
    return copy_verified(path, None, workers, progress)
