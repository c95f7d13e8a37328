"""Delta encode at the edges of its scan: the encoder compares 8-byte words a `SCAN_BLOCK` and
splits only the changed words into elements. Changes on both sides of a block boundary, only in a
tensor's last partial block, in every block and every lane of a word, tensors of no bytes and of
byte sizes that are not a multiple of 8, for every element size: the stored positions and values
must equal a plain element-by-element comparison, and the applied version must be bit-exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import _UINT, SCAN_BLOCK, apply_delta, encode_tensor, write_delta_version
from rlgw.sync.full import NamedBytes, write_full_version
from rlgw.sync.stfile import DTYPE_SIZES, SafetensorsFile

# One dtype per element size; the word split differs for each (8, 4, 2 and 1 elements a word).
DTYPES = ["U8", "BF16", "F32", "F64"]


def tensor(name: str, dtype: str, raw: np.ndarray) -> NamedBytes:
    """A flat tensor of `dtype` over the bytes `raw`."""
    return NamedBytes(name, dtype, (raw.size // DTYPE_SIZES[dtype],), raw)


def bump(raw: np.ndarray, dtype: str, elements: list[int]) -> np.ndarray:
    """A copy of `raw` whose listed elements have their low byte flipped (a change in every case)."""
    out = raw.copy()
    item = DTYPE_SIZES[dtype]
    for e in elements:
        out[e * item] ^= 0x5A
    return out


def decoded(payload: bytes, count: int, numel: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(positions, values) of a sparse payload, read the way the format defines them."""
    gw = 4 if numel < 2**32 else 8
    raw = zstd.ZstdDecompressor().decompress(payload)
    gaps = np.frombuffer(raw, dtype=_UINT[gw], count=count)
    values = np.frombuffer(raw, dtype=_UINT[DTYPE_SIZES[dtype]], offset=count * gw)
    return np.cumsum(gaps, dtype=np.int64) - 1, values


def expect_encoding(new: NamedBytes, old: np.ndarray, encoding: str) -> None:
    """`encode_tensor` stores exactly the elements an element-by-element comparison finds."""
    u = _UINT[DTYPE_SIZES[new.dtype]]
    nv, ov = new.data.view(u), old.view(u)
    want = np.flatnonzero(nv != ov)
    d = encode_tensor(new, old, ck.digest(old), encoding)
    assert d.record.digest == ck.digest(new.data)
    if want.size == 0:
        assert d.record.encoding == "unchanged" and d.payload is None
        return
    assert (d.record.layout, d.record.count) == ("sparse", want.size)
    got_pos, got_val = decoded(d.payload, d.record.count, nv.size, new.dtype)
    np.testing.assert_array_equal(got_pos, want)
    np.testing.assert_array_equal(got_val, nv[want] ^ ov[want] if encoding == "xor" else nv[want])


def round_trip(tmp_path: Path, old: list[NamedBytes], new: list[NamedBytes], encoding: str) -> None:
    """Publish base and delta, apply it, and compare every byte with `new`."""
    root = tmp_path / "pub"
    b0 = write_full_version(root, 0, old, durable=False)
    pairs = [(n, o.data) for n, o in zip(new, old, strict=True)]
    write_delta_version(root, 1, b0, pairs, encoding, durable=False)
    out = tmp_path / "out"
    out.mkdir()
    apply_delta(root / ck.version_dirname(0), root / ck.version_dirname(1), out)
    with SafetensorsFile(out / "model.safetensors") as sf:
        assert {n: bytes(sf.raw(n)) for n in sf.entries} == {t.name: t.data.tobytes() for t in new}


def random_bytes(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_changes_either_side_of_each_block_boundary_and_in_the_last_element(
    tmp_path: Path, dtype: str, encoding: str
) -> None:
    item = DTYPE_SIZES[dtype]
    per_block = SCAN_BLOCK // item
    numel = 3 * per_block + 5  # a last partial block of 5 elements (5 bytes for U8: not words)
    old = random_bytes(numel * item, 1)
    edges = [per_block - 1, per_block, 2 * per_block - 1, 2 * per_block, numel - 1]
    new = tensor("w", dtype, bump(old, dtype, edges))
    expect_encoding(new, old, encoding)
    round_trip(tmp_path, [tensor("w", dtype, old)], [new], encoding)


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_change_only_in_the_last_partial_block(tmp_path: Path, dtype: str, encoding: str) -> None:
    item = DTYPE_SIZES[dtype]
    numel = 2 * (SCAN_BLOCK // item) + 3
    old = random_bytes(numel * item, 2)
    new = tensor("w", dtype, bump(old, dtype, [numel - 2]))
    expect_encoding(new, old, encoding)
    round_trip(tmp_path, [tensor("w", dtype, old)], [new], encoding)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_lane_of_a_word_in_every_block(tmp_path: Path, dtype: str) -> None:
    """Each block has one changed word whose changed lane moves along, and one fully changed word."""
    item = DTYPE_SIZES[dtype]
    lanes, per_block = 8 // item, SCAN_BLOCK // item
    numel = 4 * per_block
    old = random_bytes(numel * item, 3)
    changes = []
    for b in range(4):
        start = b * per_block + 8 * lanes * (b + 1)
        changes.append(start + b % lanes)  # one lane of a word
        changes.extend(range(start + 4 * lanes, start + 5 * lanes))  # a whole word
    new = tensor("w", dtype, bump(old, dtype, changes))
    expect_encoding(new, old, "xor")
    expect_encoding(new, old, "overwrite")
    round_trip(tmp_path, [tensor("w", dtype, old)], [new], "xor")


def test_changes_of_random_density_match_an_element_comparison() -> None:
    rng = np.random.default_rng(4)
    for dtype in DTYPES:
        item = DTYPE_SIZES[dtype]
        numel = SCAN_BLOCK // item + 7
        old = random_bytes(numel * item, 5)
        for density in (0.001, 0.01, 0.1):
            elements = np.flatnonzero(rng.random(numel) < density).tolist()
            new = tensor("w", dtype, bump(old, dtype, elements))
            expect_encoding(new, old, "overwrite")
            if len(elements) <= numel // 8:
                expect_encoding(new, old, "xor")


def test_tensors_of_no_bytes_and_odd_byte_sizes_round_trip(tmp_path: Path) -> None:
    """Zero-size tensors are unchanged; 3-, 6- and 12-byte tensors are compared element by element."""
    sizes = {"empty.f32": ("F32", 0), "empty.u8": ("U8", 0), "three": ("U8", 3), "six": ("BF16", 6)}
    sizes["twelve"] = ("F32", 12)
    old = [tensor(n, dt, random_bytes(nb, i)) for i, (n, (dt, nb)) in enumerate(sizes.items())]
    new = [t if t.data.size == 0 else tensor(t.name, t.dtype, bump(t.data, t.dtype, [0])) for t in old]
    for n, o in zip(new, old, strict=True):
        if n.data.size:
            expect_encoding(n, o.data, "overwrite")
    assert encode_tensor(new[0], old[0].data, ck.digest(old[0].data), "xor").record.encoding == "unchanged"
    round_trip(tmp_path, old, new, "xor")
    round_trip(tmp_path / "again", old, new, "overwrite")
