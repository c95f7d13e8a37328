"""Weight sync in segments and steps on threads: every boundary, odd sizes, many tiny tensors, and a
failure in one unit, on real files. `UNIT`, `STEP` and the dense frame size are shrunk to a few bytes
so that small tensors cross many segment, step and frame boundaries (the code paths are the same)."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync import delta, full, parallel, rewrite
from rlgw.sync.delta import DELTA_FILE, _changes, _flagged, apply_delta, write_delta_version
from rlgw.sync.errors import CheckpointError, DigestMismatch
from rlgw.sync.full import copy_verified, write_full_version
from rlgw.sync.pull import pull
from rlgw.sync.stfile import SafetensorsFile
from rlgw.sync.tensors import named_bytes

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture
def small_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 256 bytes in steps of 64, dense frames of 96 bytes (not a multiple of a step)."""
    monkeypatch.setattr(parallel, "UNIT", 256)
    monkeypatch.setattr(parallel, "STEP", 64)
    monkeypatch.setattr(delta, "CHUNK", 96)


def model(seed: int) -> dict[str, torch.Tensor]:
    """Tensors around the boundaries: below, at and past a step and a segment, odd byte sizes, empty."""
    g = torch.Generator().manual_seed(seed)
    return {
        "tiny.bf16": torch.randn(3, generator=g).to(torch.bfloat16),  # 6 bytes: below a word
        "step.f32": torch.randn(16, generator=g),  # exactly one step
        "step+1.u8": torch.randint(0, 255, (65,), generator=g, dtype=torch.uint8),
        "segment.f64": torch.randn(32, generator=g, dtype=torch.float64),  # exactly one segment
        "segment-1.i16": torch.randint(-99, 99, (127,), generator=g, dtype=torch.int16),
        "odd.bf16": torch.randn(777, generator=g).to(torch.bfloat16),  # 1554 bytes: 7 segments, a tail
        "big.f32": torch.randn(40, 50, generator=g),  # 8000 bytes
        "empty.f32": torch.zeros(0),
        **{f"many.{i}": torch.randn(1 + i % 5, generator=g) for i in range(60)},  # many tiny tensors
    }


def changed(state: dict[str, torch.Tensor], every: int) -> dict[str, torch.Tensor]:
    """Every `every`-th element of each tensor bumped (1: all change, dense xor), bits included."""
    out = {}
    for name, t in state.items():
        t = t.clone()
        flat = t.view(-1).view(torch.uint8) if t.dtype == torch.uint8 else t.view(-1)
        if flat.numel():
            flat[::every] = flat[::every] + 1
        out[name] = t
    out["segment-1.i16"][-1] = 7  # a change in the last element, past the last whole word
    return out


def pairs(new: dict, old: dict) -> list:
    olds = {t.name: t.data for t in named_bytes(old.items())}
    return [(t, olds[t.name]) for t in named_bytes(new.items())]


def content(vdir: Path) -> dict[str, bytes]:
    with SafetensorsFile(vdir / "model.safetensors") as sf:
        return {n: bytes(sf.raw(n)) for n in sf.entries}


def expected(state: dict) -> dict[str, bytes]:
    return {t.name: t.data.tobytes() for t in named_bytes(state.items())}


def test_changed_positions_match_an_element_by_element_scan() -> None:
    """Word-at-a-time comparison finds exactly the changed elements, for every element size."""
    rng = np.random.default_rng(0)
    for item in (1, 2, 4, 8):
        for numel in (0, 1, 3, 8, 513, 4099):
            for density in (0.0, 0.01, 0.3, 1.0):
                old = rng.integers(0, 256, numel * item, dtype=np.uint8)
                new = old.copy()
                nv, ov = new.view(UINT[item]), old.view(UINT[item])
                nv[rng.random(numel) < density] += 1
                ref = np.flatnonzero(nv != ov)
                for xor in (True, False):
                    pos, vals = _changes(new, old, item, xor)
                    assert pos.tolist() == ref.tolist()
                    assert vals.tolist() == ((nv ^ ov)[ref] if xor else nv[ref]).tolist()


def test_two_level_flag_scan_matches_flatnonzero() -> None:
    rng = np.random.default_rng(1)
    for size in (0, 8, 64, 4096, 1 << 17):
        for density in (0.0, 0.001, 0.04, 0.5, 1.0):
            flags = rng.random(size) < density
            assert _flagged(flags).tolist() == np.flatnonzero(flags).tolist()


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize("every", [1, 3, 50])
@pytest.mark.parametrize("workers", [1, 3])
def test_small_segments_round_trip_bit_exact(
    tmp_path: Path, small_units: None, encoding: str, every: int, workers: int
) -> None:
    old = model(0)
    new = changed(old, every)
    b0 = write_full_version(tmp_path, 0, named_bytes(old.items()), durable=False, workers=workers)
    assert {n: r.digest for n, r in b0.tensors.items()} == {
        t.name: ck.digest(t.data) for t in named_bytes(old.items())
    }
    d1 = write_delta_version(tmp_path, 1, b0, pairs(new, old), encoding, durable=False, workers=workers)
    if encoding == "xor" and every == 1:
        assert d1.tensors["odd.bf16"].layout == "dense"
    out = tmp_path / "out"
    out.mkdir()
    got = apply_delta(
        tmp_path / ck.version_dirname(0), tmp_path / ck.version_dirname(1), out, workers=workers
    )
    assert content(out) == expected(new)
    assert got.checkpoint_digest == d1.checkpoint_digest
    copy = tmp_path / "copy"
    copy.mkdir()
    copy_verified(out, copy, workers=workers)
    assert content(copy) == expected(new)


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_chunking_and_threads_do_not_change_a_byte_of_the_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    """The published delta is the same file whatever the segment and step sizes and the thread count."""
    old, new = model(2), changed(model(2), 7)
    files = []
    for i, (unit, step, workers) in enumerate([(parallel.UNIT, parallel.STEP, 1), (256, 64, 3), (64, 8, 2)]):
        monkeypatch.setattr(parallel, "UNIT", unit)
        monkeypatch.setattr(parallel, "STEP", step)
        root = tmp_path / str(i)
        b0 = write_full_version(root, 0, named_bytes(old.items()), durable=False, workers=workers)
        write_delta_version(root, 1, b0, pairs(new, old), encoding, durable=False, workers=workers)
        files.append((root / ck.version_dirname(1) / DELTA_FILE).read_bytes())
    assert files[0] == files[1] == files[2]


def _flip_one_payload(root: Path, name: str) -> None:
    """Flip a bit of the last stored value of `name`'s sparse overwrite payload (positions stay valid)."""
    import zstandard as zstd

    from rlgw.sync.stfile import write_file

    vdir = root / ck.version_dirname(1)
    with SafetensorsFile(vdir / DELTA_FILE) as sf:
        payloads = {n: bytes(sf.raw(n)) for n in sf.entries}
        metadata = dict(sf.metadata)
    raw = bytearray(zstd.ZstdDecompressor().decompress(payloads[name]))
    raw[-1] ^= 1
    payloads[name] = zstd.ZstdCompressor(level=1, write_content_size=True).compress(bytes(raw))
    write_file(
        vdir / DELTA_FILE, [(n, "U8", (len(p),), p) for n, p in payloads.items()], metadata, fsync=False
    )
    index = ck.read_index(vdir)
    index.tensors[name].stored = len(payloads[name])
    ck.write_index(vdir, index)


def test_a_bad_tensor_in_one_unit_fails_the_pull_and_publishes_nothing(
    tmp_path: Path, small_units: None
) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    old = model(3)
    new = changed(old, 5)
    b0 = write_full_version(root, 0, named_bytes(old.items()), durable=False)
    write_delta_version(root, 1, b0, pairs(new, old), "overwrite", durable=False)
    pull(root, 0, local, workers=3, durable=False)
    _flip_one_payload(root, "odd.bf16")
    with pytest.raises(DigestMismatch, match=r"'odd\.bf16'.*after patch") as err:
        pull(root, 1, local, workers=3, durable=False)
    assert any("raised in a weight-sync unit" in note for note in err.value.__notes__)
    assert sorted(p.name for p in local.iterdir() if p.name != ".lock") == [ck.version_dirname(0)]
    assert content(local / ck.version_dirname(0)) == expected(old)


def _failing_pwrite(monkeypatch: pytest.MonkeyPatch, module: object, after: int) -> None:
    """`pwrite_all` in `module` fails with a full disk from its `after`-th call on (a fault, not a fake)."""
    real, calls = module.pwrite_all, [0]

    def pwrite_all(fd: int, buf: object, offset: int) -> None:
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, buf, offset)

    monkeypatch.setattr(module, "pwrite_all", pwrite_all)


def test_a_full_disk_in_one_unit_of_an_apply_is_a_checkpoint_error(
    tmp_path: Path, small_units: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    old = model(4)
    b0 = write_full_version(root, 0, named_bytes(old.items()), durable=False)
    write_delta_version(root, 1, b0, pairs(changed(old, 2), old), "xor", durable=False)
    pull(root, 0, local, workers=3, durable=False)
    _failing_pwrite(monkeypatch, rewrite, after=20)
    with pytest.raises(CheckpointError, match="No space left"):
        pull(root, 1, local, workers=3, durable=False)
    assert sorted(p.name for p in local.iterdir() if p.name != ".lock") == [ck.version_dirname(0)]


def test_a_full_disk_while_writing_a_full_version_publishes_nothing(
    tmp_path: Path, small_units: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_pwrite(monkeypatch, full, after=30)
    with pytest.raises(CheckpointError, match="No space left"):
        write_full_version(tmp_path, 0, named_bytes(model(5).items()), durable=False, workers=3)
    assert list(tmp_path.iterdir()) == []
