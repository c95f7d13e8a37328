"""Delta versions at their edges: what `write_delta_version` and `apply_delta` refuse, and the
encodings' corner cases (changes at element 0 and side by side), on real files, no engine."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import DELTA_FILE, apply_delta, write_delta_version
from rlgw.sync.errors import CheckpointError, VersionError
from rlgw.sync.full import write_full_version
from rlgw.sync.stfile import SafetensorsFile, write_file
from rlgw.sync.tensors import named_bytes


def base_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {"w": torch.randn(1000, generator=g), "same": torch.randn(50, generator=g)}


def changed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Element 0 and a run of side-by-side elements change (sparse gaps of exactly 1)."""
    w = state["w"].clone()
    w[0] += 1.0
    w[10:20] += 2.0
    w[-1] += 3.0
    return {"w": w, "same": state["same"].clone()}


def pairs(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]) -> list:
    olds = {t.name: t.data for t in named_bytes(old.items())}
    return [(t, olds[t.name]) for t in named_bytes(new.items())]


def publish(root: Path, encoding: str) -> dict[str, torch.Tensor]:
    old = base_state()
    new = changed(old)
    index = write_full_version(root, 0, named_bytes(old.items()), durable=False)
    write_delta_version(root, 1, index, pairs(new, old), encoding, durable=False)
    return new


def apply(root: Path, out: Path) -> ck.VersionIndex:
    out.mkdir()
    return apply_delta(root / ck.version_dirname(0), root / ck.version_dirname(1), out)


def content(vdir: Path) -> dict[str, bytes]:
    with SafetensorsFile(vdir / "model.safetensors") as sf:
        return {n: bytes(sf.raw(n)) for n in sf.entries}


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_changes_at_element_zero_and_side_by_side_round_trip(tmp_path: Path, encoding: str) -> None:
    new = publish(tmp_path / "pub", encoding)
    rec = ck.read_index(tmp_path / "pub" / ck.version_dirname(1)).tensors["w"]
    assert (rec.layout, rec.count) == ("sparse", 12)
    apply(tmp_path / "pub", tmp_path / "out")
    assert content(tmp_path / "out") == {t.name: t.data.tobytes() for t in named_bytes(new.items())}


def test_write_refuses_an_old_version_another_tensor_set_and_an_unknown_encoding(tmp_path: Path) -> None:
    old = base_state()
    index = write_full_version(tmp_path, 3, named_bytes(old.items()), durable=False)
    new = changed(old)
    with pytest.raises(VersionError, match="newer than its base"):
        write_delta_version(tmp_path, 3, index, pairs(new, old), "xor", durable=False)
    fewer = {"w": new["w"]}
    with pytest.raises(VersionError, match=r"missing \['same'\], extra \[\]"):
        write_delta_version(tmp_path, 4, index, pairs(fewer, old), "xor", durable=False)
    with pytest.raises(ValueError, match="unknown delta encoding"):
        write_delta_version(tmp_path, 4, index, pairs(new, old), "rle", durable=False)
    assert [v.version for v in ck.list_versions(tmp_path)] == [3]


def edit_index(root: Path, name: str, **change: object) -> None:
    vdir = root / ck.version_dirname(1)
    index = ck.read_index(vdir)
    index.tensors[name] = dataclasses.replace(index.tensors[name], **change)
    ck.write_index(vdir, index)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("w", {"layout": "striped"}, "bad layout"),
        ("w", {"layout": "dense", "encoding": "overwrite"}, "bad layout"),
        ("w", {"encoding": "rle"}, "unknown encoding"),
        ("same", {"digest": "0" * 32}, "unchanged tensor 'same' with a new digest"),
        ("w", {"stored": 3}, "missing or of the wrong size"),
    ],
    ids=["unknown-layout", "dense-overwrite", "unknown-encoding", "unchanged-new-digest", "wrong-size"],
)
def test_apply_refuses_an_inconsistent_index_before_writing(
    tmp_path: Path, name: str, change: dict, message: str
) -> None:
    root = tmp_path / "pub"
    publish(root, "overwrite")
    edit_index(root, name, **change)
    with pytest.raises(CheckpointError, match=message):
        apply(root, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_apply_refuses_a_full_version_as_delta_and_a_delta_as_base(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    publish(root, "xor")
    v0, v1 = root / ck.version_dirname(0), root / ck.version_dirname(1)
    for base, delta, message in ((v0, v0, "not a delta version"), (v1, v1, "base must be a full version")):
        out = tmp_path / f"out-{message.split()[0]}"
        out.mkdir()
        with pytest.raises(CheckpointError, match=message):
            apply_delta(base, delta, out)


def test_apply_refuses_a_delta_naming_other_tensors(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    publish(root, "xor")
    other = tmp_path / "other"
    write_full_version(other, 0, named_bytes({"w": base_state()["w"]}.items()), durable=False)
    (tmp_path / "out").mkdir()
    with pytest.raises(VersionError, match="names other tensors"):
        apply_delta(other / ck.version_dirname(0), root / ck.version_dirname(1), tmp_path / "out")


def test_a_sparse_position_past_the_tensor_is_refused(tmp_path: Path) -> None:
    """A payload whose last position points one element past the end (gaps are 1-based)."""
    root = tmp_path / "pub"
    publish(root, "overwrite")
    vdir = root / ck.version_dirname(1)
    rec = ck.read_index(vdir).tensors["w"]
    with SafetensorsFile(vdir / DELTA_FILE) as sf:
        payloads = {n: bytes(sf.raw(n)) for n in sf.entries}
        metadata = dict(sf.metadata)
    raw = bytearray(zstd.ZstdDecompressor().decompress(payloads["w"]))
    gaps = np.frombuffer(raw, dtype=np.uint32, count=rec.count).copy()
    gaps[-1] += 1  # the last change was at element 999 of 1000: now at 1000
    raw[: gaps.nbytes] = gaps.tobytes()
    payloads["w"] = zstd.ZstdCompressor(level=1, write_content_size=True).compress(bytes(raw))
    write_file(
        vdir / DELTA_FILE, [(n, "U8", (len(p),), p) for n, p in payloads.items()], metadata, fsync=False
    )
    edit_index(root, "w", stored=len(payloads["w"]))
    with pytest.raises(CheckpointError, match="beyond 1000 elements"):
        apply(root, tmp_path / "out")


def dense_delta(root: Path) -> None:
    """v0 and v1 where every element of `w` changed (a dense XOR stream)."""
    old = {"w": torch.randn(3000, generator=torch.Generator().manual_seed(2))}
    index = write_full_version(root, 0, named_bytes(old.items()), durable=False)
    write_delta_version(root, 1, index, pairs({"w": old["w"] * 1.5}, old), "xor", durable=False)
    assert ck.read_index(root / ck.version_dirname(1)).tensors["w"].layout == "dense"


def reencode(root: Path, name: str, edit: Callable[[bytes], bytes]) -> None:
    vdir = root / ck.version_dirname(1)
    with SafetensorsFile(vdir / DELTA_FILE) as sf:
        payloads = {n: bytes(sf.raw(n)) for n in sf.entries}
        metadata = dict(sf.metadata)
    raw = zstd.ZstdDecompressor().stream_reader(payloads[name], read_across_frames=True).read()
    payloads[name] = zstd.ZstdCompressor(level=1, write_content_size=True).compress(edit(raw))
    stored = [(n, "U8", (len(p),), p) for n, p in payloads.items()]
    write_file(vdir / DELTA_FILE, stored, metadata, fsync=False)
    edit_index(root, name, stored=len(payloads[name]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [(lambda raw: raw[:-100], "truncated"), (lambda raw: raw + b"\0" * 8, "longer than its tensor")],
    ids=["short", "long"],
)
def test_a_dense_stream_of_the_wrong_length_is_refused(
    tmp_path: Path, edit: Callable[[bytes], bytes], message: str
) -> None:
    root = tmp_path / "pub"
    dense_delta(root)
    reencode(root, "w", edit)
    with pytest.raises(CheckpointError, match=message):
        apply(root, tmp_path / "out")


def test_apply_closes_every_file_it_opens(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    publish(root, "xor")
    before = len(os.listdir("/proc/self/fd"))
    apply(root, tmp_path / "out")
    assert len(os.listdir("/proc/self/fd")) == before
