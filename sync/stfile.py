"""Minimal streaming reader and writer for the safetensors file format (no torch, no pickle).

Owns the byte layout only: an 8-byte little-endian header length, a JSON header (`{name: {dtype,
shape, data_offsets}}` plus an optional string-to-string `__metadata__`), then the raw tensor bytes.
Files written here load with the `safetensors` library and with `transformers`; files read here are
validated (header bounds, offsets, size) before any byte is trusted, and are memory-mapped so that a
tensor's bytes are a zero-copy `memoryview`. What the bytes mean (versions, encodings, digests) is
`rlgw.sync.checkpoint`'s business.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
from typing_extensions import Buffer

from rlgw.sync.errors import CheckpointError

# safetensors dtype name -> element size in bytes.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_MAX_HEADER = 256 << 20


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor's place in a file: dtype name, shape and byte range relative to the data section."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def nbytes_of(dtype: str, shape: Iterable[int]) -> int:
    """Byte size of a tensor of `dtype` (safetensors name) and `shape`."""
    n = DTYPE_SIZES[dtype]
    for d in shape:
        n *= int(d)
    return n


def build_header(
    specs: Iterable[tuple[str, str, tuple[int, ...], int]], metadata: dict[str, str] | None
) -> bytes:
    """Serialized header (length prefix included) for `(name, dtype, shape, nbytes)` laid out in order."""
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, nbytes in specs:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    body = orjson.dumps(doc)
    body += b" " * (-(len(body) + 8) % 8)  # data starts 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(body)) + body


def write_file(
    path: Path,
    tensors: Iterable[tuple[str, str, tuple[int, ...], Buffer]],
    metadata: dict[str, str] | None = None,
    fsync: bool = True,
) -> int:
    """Write `(name, dtype, shape, bytes)` tensors to `path`; returns the file size.

    The buffers are written as they are (any object exposing the buffer protocol, no copy); each
    must hold exactly `nbytes_of(dtype, shape)` bytes, except `U8` blobs whose shape is their length.
    """
    items = list(tensors)
    specs = []
    for name, dtype, shape, buf in items:
        size = memoryview(buf).nbytes
        if size != nbytes_of(dtype, shape):
            raise ValueError(f"{name}: {size} bytes for {dtype}{list(shape)}")
        specs.append((name, dtype, shape, size))
    header = build_header(specs, metadata)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, header)
        for _, _, _, buf in items:
            _write_all(fd, buf)
        if fsync:
            os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _write_all(fd: int, buf: Buffer) -> None:
    view = memoryview(buf).cast("B")
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


class SafetensorsFile:
    """A validated, memory-mapped safetensors file: `entries` by name and zero-copy `raw(name)` bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise CheckpointError(f"{path}: truncated ({size} bytes, no header)")
                (hlen,) = struct.unpack("<Q", f.read(8))
                if hlen > _MAX_HEADER or 8 + hlen > size:
                    raise CheckpointError(f"{path}: truncated or corrupt header (length {hlen}, file {size})")
                header = orjson.loads(f.read(hlen))
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read ({exc})") from exc
        except orjson.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: header is not JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: header is not an object")
        self.data_start = 8 + hlen
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.entries: dict[str, TensorEntry] = {}
        data_len = size - self.data_start
        for name, spec in header.items():
            try:
                dtype, shape, (start, end) = spec["dtype"], tuple(spec["shape"]), spec["data_offsets"]
                expected = nbytes_of(dtype, shape)
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{path}: bad header entry for {name!r}") from exc
            if end - start != expected or start < 0:
                raise CheckpointError(f"{path}: {name!r} spans {end - start} bytes, expected {expected}")
            if end > data_len:
                raise CheckpointError(
                    f"{path}: truncated ({name!r} ends at {end}, data has {data_len} bytes)"
                )
            self.entries[name] = TensorEntry(dtype, shape, start, end)

    def raw(self, name: str) -> memoryview:
        """The bytes of tensor `name` (read-only, zero-copy)."""
        e = self.entries[name]
        if e.nbytes == 0:
            return memoryview(b"")
        return memoryview(self._mm)[self.data_start + e.start : self.data_start + e.end]

    def close(self) -> None:
        """Unmap the file; views from `raw` must not be used afterwards."""
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # A caller still holds a view; the mapping is released when that view is collected.
                pass
            self._mm = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
