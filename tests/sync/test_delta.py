"""Delta encode/apply on real files: bit-exact round trips and every refusal, without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import DELTA_FILE, apply_delta, write_delta_version
from rlgw.sync.errors import CheckpointError, DigestMismatch, VersionError
from rlgw.sync.fileio import CHUNK
from rlgw.sync.full import copy_verified, write_full_version
from rlgw.sync.stfile import SafetensorsFile
from rlgw.sync.tensors import named_bytes


def states(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A base and a new state: bf16 (one tensor over a chunk), fp32, odd sizes, one unchanged tensor."""
    g = torch.Generator().manual_seed(seed)
    base = {
        "big.bf16": torch.randn(CHUNK // 2 + 777, generator=g).to(torch.bfloat16),
        "w.f32": torch.randn(33, 17, generator=g),
        "odd.bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "same": torch.randn(10, generator=g),
    }
    new = {k: v.clone() for k, v in base.items()}
    for k in ("big.bf16", "w.f32", "odd.bf16"):
        flat = new[k].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 100)]
        flat[idx] += 1
    new["big.bf16"].view(-1)[-1] += 3  # a change in the final partial chunk
    return base, new


def publish(tmp: Path, encoding: str) -> tuple[Path, dict[str, torch.Tensor]]:
    base, new = states()
    b0 = write_full_version(tmp, 0, named_bytes(base.items()), durable=False)
    pairs = list(zip(named_bytes(new.items()), [t.data for t in named_bytes(base.items())], strict=True))
    write_delta_version(tmp, 1, b0, pairs, encoding, durable=False)
    return tmp, new


def read_all(vdir: Path) -> dict[str, bytes]:
    with SafetensorsFile(vdir / "model.safetensors") as sf:
        return {n: bytes(sf.raw(n)) for n in sf.entries}


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_round_trip_is_bit_exact(tmp_path: Path, encoding: str) -> None:
    root, new = publish(tmp_path / "pub", encoding)
    delta = ck.read_index(root / "weight_v000001")
    assert delta.tensors["same"].encoding == "unchanged"
    with SafetensorsFile(root / "weight_v000001" / DELTA_FILE) as sf:
        assert "same" not in sf.entries  # unchanged tensors are omitted
    out = tmp_path / "out"
    out.mkdir()
    index = apply_delta(root / "weight_v000000", root / "weight_v000001", out)
    assert index.version == 1 and index.kind == "full"
    got = read_all(out)
    assert got == {n: named_bytes([(n, t)])[0].data.tobytes() for n, t in new.items()}
    assert copy_verified(out, None).checkpoint_digest == delta.checkpoint_digest


def test_xor_applied_to_its_own_output_is_refused(tmp_path: Path) -> None:
    root, _ = publish(tmp_path / "pub", "xor")
    once = tmp_path / "once"
    once.mkdir()
    apply_delta(root / "weight_v000000", root / "weight_v000001", once)
    twice = tmp_path / "twice"
    twice.mkdir()
    # A second XOR would restore the old bytes; the base version check stops it first.
    with pytest.raises(VersionError, match="applies to v0"):
        apply_delta(once, root / "weight_v000001", twice)
    assert list(twice.iterdir()) == []


def test_corrupt_payload_fails_the_digest_or_decoder(tmp_path: Path) -> None:
    root, _ = publish(tmp_path / "pub", "xor")
    f = root / "weight_v000001" / DELTA_FILE
    raw = bytearray(f.read_bytes())
    raw[-50] ^= 0x01
    f.write_bytes(bytes(raw))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises((DigestMismatch, CheckpointError)):
        apply_delta(root / "weight_v000000", root / "weight_v000001", out)


def test_truncated_payload_is_refused_before_any_write(tmp_path: Path) -> None:
    root, _ = publish(tmp_path / "pub", "overwrite")
    f = root / "weight_v000001" / DELTA_FILE
    f.write_bytes(f.read_bytes()[:-10])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CheckpointError, match="truncated"):
        apply_delta(root / "weight_v000000", root / "weight_v000001", out)
    assert list(out.iterdir()) == []


def test_wrong_base_bytes_are_refused(tmp_path: Path) -> None:
    root, _ = publish(tmp_path / "pub", "xor")
    other_base, _ = states(seed=1)
    other = tmp_path / "other"
    write_full_version(other, 0, named_bytes(other_base.items()), durable=False)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(VersionError, match="wrong base"):
        apply_delta(other / "weight_v000000", root / "weight_v000001", out)


def test_tampered_full_version_fails_verification(tmp_path: Path) -> None:
    base, _ = states()
    write_full_version(tmp_path, 3, named_bytes(base.items()), durable=False)
    f = tmp_path / "weight_v000003" / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(DigestMismatch, match="same"):
        copy_verified(tmp_path / "weight_v000003", None)


def test_versions_are_immutable_and_index_is_checked(tmp_path: Path) -> None:
    base, _ = states()
    write_full_version(tmp_path, 1, named_bytes(base.items()), durable=False)
    with pytest.raises(VersionError, match="immutable"):
        write_full_version(tmp_path, 1, named_bytes(base.items()), durable=False)
    idx = tmp_path / "weight_v000001" / ck.INDEX_NAME
    idx.write_bytes(idx.read_bytes().replace(b'"version": 1', b'"version": 2'))
    with pytest.raises(CheckpointError, match="index says v2"):
        ck.read_index(tmp_path / "weight_v000001")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_loads_with_the_reference_safetensors_library(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    base, _ = states()
    write_full_version(tmp_path, 0, named_bytes(base.items()), durable=False)
    loaded = load_file(str(tmp_path / "weight_v000000" / "model.safetensors"))
    assert loaded.keys() == base.keys() and all(torch.equal(loaded[k], base[k]) for k in base)


def test_xor_switches_to_dense_frames_when_much_changes(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(CHUNK // 4 + 99, generator=g), "few": torch.randn(1000, generator=g)}
    new = {"w": base["w"] * 1.5, "few": base["few"].clone()}
    new["few"][7] += 1
    b0 = write_full_version(tmp_path, 0, named_bytes(base.items()), durable=False)
    pairs = list(zip(named_bytes(new.items()), [t.data for t in named_bytes(base.items())], strict=True))
    index = write_delta_version(tmp_path, 1, b0, pairs, "xor", durable=False)
    assert (index.tensors["w"].layout, index.tensors["few"].layout) == ("dense", "sparse")
    assert index.tensors["few"].count == 1
    out = tmp_path / "out"
    out.mkdir()
    apply_delta(tmp_path / "weight_v000000", tmp_path / "weight_v000001", out)
    assert read_all(out) == {n: named_bytes([(n, t)])[0].data.tobytes() for n, t in new.items()}
