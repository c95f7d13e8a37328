"""Delta gaps the mutation bench found (`bench/mutation.py`), on real safetensors files: dense XOR
of tensors whose byte size is not a multiple of 8 (a 4-byte scalar, 6, 9 and 17 bytes) or that
spans several zstd frames, a sparse payload whose frame does not state its size, and the
refusals of `encode_tensor` and `write_delta_version` (a tensor that changed size, an unknown
encoding even when nothing changed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import DELTA_FILE, apply_delta, encode_tensor, write_delta_version
from rlgw.sync.errors import CheckpointError, VersionError
from rlgw.sync.fileio import CHUNK
from rlgw.sync.full import write_full_version
from rlgw.sync.stfile import SafetensorsFile, write_file
from rlgw.sync.tensors import named_bytes
from tests.sync.test_delta_refusals import apply, base_state, content, edit_index, pairs, publish, reencode

# Every element changes, so xor stores each tensor dense; byte sizes 4, 6, 9, 16 and 17.
BASE = {
    "scalar.f32": torch.tensor([1.5]),
    "three.f16": torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16),
    "nine.u8": torch.arange(9, dtype=torch.uint8),
    "four.f32": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "seventeen.i8": torch.arange(17, dtype=torch.int8),
}


def _new() -> dict[str, torch.Tensor]:
    return {k: (v + 1).to(v.dtype) for k, v in BASE.items()}


def test_dense_xor_round_trips_tensors_of_any_byte_size(tmp_path: Path) -> None:
    new = _new()
    old = {t.name: t.data for t in named_bytes(BASE.items())}
    b0 = write_full_version(tmp_path, 0, named_bytes(BASE.items()), durable=False)
    pairs = [(t, old[t.name]) for t in named_bytes(new.items())]
    delta = write_delta_version(tmp_path, 1, b0, pairs, "xor", durable=False)
    assert {r.layout for r in delta.tensors.values()} == {"dense"}
    out = tmp_path / "out"
    out.mkdir()
    apply_delta(tmp_path / ck.version_dirname(0), tmp_path / ck.version_dirname(1), out)
    with SafetensorsFile(out / "model.safetensors") as sf:
        got = {n: bytes(sf.raw(n)) for n in sf.entries}
    assert got == {t.name: t.data.tobytes() for t in named_bytes(new.items())}


def test_encode_refuses_a_tensor_that_changed_size() -> None:
    [grown] = named_bytes([("w", torch.zeros(5))])
    old = named_bytes([("w", torch.zeros(4))])[0].data
    with pytest.raises(VersionError, match="base has 16 bytes, new state 20"):
        encode_tensor(grown, old, ck.digest(old), "xor")


def test_encode_refuses_an_unknown_encoding_for_a_changed_tensor() -> None:
    [new] = named_bytes([("w", torch.ones(4))])
    old = np.zeros(16, dtype=np.uint8)
    with pytest.raises(ValueError, match="unknown delta encoding 'zip'"):
        encode_tensor(new, old, ck.digest(old), "zip")
    # An unchanged tensor needs no encoding at all.
    assert encode_tensor(new, new.data.copy(), ck.digest(new.data), "zip").payload is None


def test_an_unknown_encoding_is_refused_even_when_nothing_changed(tmp_path: Path) -> None:
    state = base_state()
    b0 = write_full_version(tmp_path, 0, named_bytes(state.items()), durable=False)
    with pytest.raises(ValueError, match="unknown delta encoding 'zip'"):
        write_delta_version(tmp_path, 1, b0, pairs(state, state), "zip", durable=False)
    assert not (tmp_path / ck.version_dirname(1)).exists()


def test_a_dense_xor_over_several_frames_round_trips(tmp_path: Path) -> None:
    old = {"w": torch.randn(CHUNK // 4 + 1000, generator=torch.Generator().manual_seed(5))}
    new = {"w": old["w"] * 1.5}  # every element changes: dense, one zstd frame per chunk
    b0 = write_full_version(tmp_path, 0, named_bytes(old.items()), durable=False)
    index = write_delta_version(tmp_path, 1, b0, pairs(new, old), "xor", durable=False)
    assert index.tensors["w"].layout == "dense"
    apply(tmp_path, tmp_path / "out")
    assert content(tmp_path / "out") == {"w": named_bytes(new.items())[0].data.tobytes()}


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_a_sparse_payload_whose_frame_omits_its_size_still_applies(tmp_path: Path, encoding: str) -> None:
    """zstd frames need not state their decompressed size (streaming writers omit it); the record's
    count of changed elements bounds the output instead."""
    root = tmp_path / "pub"
    new = publish(root, encoding)
    vdir = root / ck.version_dirname(1)
    with SafetensorsFile(vdir / DELTA_FILE) as sf:
        payloads = {n: bytes(sf.raw(n)) for n in sf.entries}
        metadata = dict(sf.metadata)
    raw = zstd.ZstdDecompressor().decompress(payloads["w"])
    payloads["w"] = zstd.ZstdCompressor(level=1, write_content_size=False).compress(raw)
    assert zstd.frame_content_size(payloads["w"]) == -1  # unknown
    write_file(
        vdir / DELTA_FILE, [(n, "U8", (len(p),), p) for n, p in payloads.items()], metadata, fsync=False
    )
    edit_index(root, "w", stored=len(payloads["w"]))
    apply(root, tmp_path / "out")
    assert content(tmp_path / "out") == {t.name: t.data.tobytes() for t in named_bytes(new.items())}


def _first_gap_zero(raw: bytes) -> bytes:
    gaps = bytearray(raw)
    gaps[4:8] = bytes(4)  # the second position repeats the first (uint32 gaps)
    return bytes(gaps)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw + bytes(8), "sparse payload has"),
        (lambda raw: raw[:-8], "sparse payload has"),
        (_first_gap_zero, "non-increasing positions"),
    ],
    ids=["long", "short", "repeated-position"],
)
def test_a_malformed_sparse_payload_is_refused(
    tmp_path: Path, edit: Callable[[bytes], bytes], message: str
) -> None:
    root = tmp_path / "pub"
    publish(root, "overwrite")
    reencode(root, "w", edit)
    with pytest.raises(CheckpointError, match=message):
        apply(root, tmp_path / "out")


def _mapped(*paths: Path) -> list[str]:
    """Lines of /proc/self/maps that map one of `paths` (an open `SafetensorsFile` holds an mmap)."""
    names = {str(p.resolve()) for p in paths}
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if line.split()[-1] in names]


def test_a_failed_apply_leaves_no_file_mapped(tmp_path: Path) -> None:
    """While the error (and its traceback, holding apply's frame) is alive, nothing stays mapped."""
    root = tmp_path / "pub"
    publish(root, "overwrite")
    reencode(root, "w", lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]))  # one value bit off
    with pytest.raises(CheckpointError, match="after patch") as err:
        apply(root, tmp_path / "out")
    base, delta = root / ck.version_dirname(0), root / ck.version_dirname(1)
    assert err.value is not None and _mapped(base / "model.safetensors", delta / DELTA_FILE) == []


def test_progress_counts_every_byte_and_aux_files_are_carried(tmp_path: Path) -> None:
    aux = tmp_path / "aux"
    aux.mkdir()
    (aux / "config.json").write_text('{"hidden_size": 8}')
    old = base_state()
    b0 = write_full_version(tmp_path, 0, named_bytes(old.items()), aux_src=aux, durable=False)
    total = sum(t.data.size for t in named_bytes(old.items()))
    written: list[int] = []
    new = {"w": old["w"] + 1, "same": old["same"]}
    write_delta_version(tmp_path, 1, b0, pairs(new, old), "xor", durable=False, progress=written.append)
    assert sum(written) == total
    applied: list[int] = []
    out = tmp_path / "out"
    out.mkdir()
    apply_delta(
        tmp_path / ck.version_dirname(0), tmp_path / ck.version_dirname(1), out, progress=applied.append
    )
    assert sum(applied) == total
    assert (out / "config.json").read_text() == '{"hidden_size": 8}'
