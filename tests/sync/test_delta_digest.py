"""The digest check of delta versions, without an engine: a delta that decodes but patches wrong bytes.

A flipped bit inside a payload can decode cleanly (zstd frames carry no checksum here), so the
decoder does not catch it: only the digest of each patched tensor, checked against the delta's
index, does. Each layout (sparse overwrite, sparse xor, dense xor) gets a payload that decodes
to one wrong bit; `apply_delta` must raise `DigestMismatch`, and `pull` must refuse it without
committing anything or disturbing the local version it started from.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import DELTA_FILE, apply_delta, write_delta_version
from rlgw.sync.errors import DigestMismatch
from rlgw.sync.fileio import CHUNK
from rlgw.sync.full import write_full_version
from rlgw.sync.pull import committed_versions, pull
from rlgw.sync.stfile import SafetensorsFile, write_file
from rlgw.sync.tensors import named_bytes


def state(seed: int) -> dict[str, torch.Tensor]:
    """`few`: a few elements change per step (sparse); `all`: every element changes (dense xor)."""
    g = torch.Generator().manual_seed(seed)
    return {"few": torch.randn(4000, generator=g), "all": torch.randn(CHUNK // 4 + 123, generator=g)}


def step(s: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    few = s["few"].clone()
    few[torch.randperm(few.numel(), generator=g)[:20]] += 1.0
    return {"few": few, "all": s["all"] * 1.5}


def publish(root: Path, encoding: str, versions: int = 1) -> list[dict[str, torch.Tensor]]:
    """v0 full, then `versions` deltas; returns the states (index = version)."""
    states = [state(0)]
    index = write_full_version(root, 0, named_bytes(states[0].items()), durable=False)
    for v in range(1, versions + 1):
        states.append(step(states[-1], v))
        old = [t.data for t in named_bytes(states[-2].items())]
        pairs = list(zip(named_bytes(states[-1].items()), old, strict=True))
        write_delta_version(root, v, index, pairs, encoding, durable=False)
        index = ck.read_index(root / ck.version_dirname(v))
    return states


def tamper(delta_dir: Path, name: str, *, flip: bool = True) -> None:
    """Re-encode `name`'s payload as one clean zstd frame, with one bit of its content flipped.

    Sparse payloads flip a bit of the first stored value (not a position), dense ones a bit in
    the middle of the XOR stream. The index is updated to the new payload size, so the delta
    stays well-formed; with `flip=False` it is the same delta, re-encoded.
    """
    index = ck.read_index(delta_dir)
    rec = index.tensors[name]
    with SafetensorsFile(delta_dir / DELTA_FILE) as sf:
        payloads = {n: bytes(sf.raw(n)) for n in sf.entries}
        metadata = dict(sf.metadata)
    reader = zstd.ZstdDecompressor().stream_reader(payloads[name], read_across_frames=True)
    raw = bytearray(reader.read())
    if flip:
        if rec.layout == "sparse":
            gap_width = 4 if math.prod(rec.shape) < 2**32 else 8  # positions first, then the values
            raw[rec.count * gap_width] ^= 0x01
        else:
            raw[len(raw) // 2] ^= 0x01
    payloads[name] = zstd.ZstdCompressor(level=1, write_content_size=True).compress(bytes(raw))
    write_file(
        delta_dir / DELTA_FILE, [(n, "U8", (len(p),), p) for n, p in payloads.items()], metadata, False
    )
    index.tensors[name] = dataclasses.replace(rec, stored=len(payloads[name]))
    ck.write_index(delta_dir, index)


CASES = [("overwrite", "few", "sparse"), ("xor", "few", "sparse"), ("xor", "all", "dense")]


@pytest.mark.parametrize(("encoding", "name", "layout"), CASES, ids=[f"{e}-{lay}" for e, _, lay in CASES])
def test_a_payload_that_decodes_to_wrong_bytes_fails_the_digest(
    tmp_path: Path, encoding: str, name: str, layout: str
) -> None:
    root = tmp_path / "pub"
    publish(root, encoding)
    delta = root / ck.version_dirname(1)
    assert ck.read_index(delta).tensors[name].layout == layout
    tamper(delta, name, flip=False)  # re-encoding alone keeps a valid delta
    good = tmp_path / "good"
    good.mkdir()
    apply_delta(root / ck.version_dirname(0), delta, good)
    tamper(delta, name)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch, match=repr(name)):
        apply_delta(root / ck.version_dirname(0), delta, out)


def local_bytes(vdir: Path) -> dict[str, bytes]:
    with SafetensorsFile(vdir / "model.safetensors") as sf:
        return {n: bytes(sf.raw(n)) for n in sf.entries}


@pytest.mark.parametrize(("encoding", "name"), [("overwrite", "few"), ("xor", "all")])
def test_pull_refuses_a_corrupt_delta_and_keeps_the_local_version(
    tmp_path: Path, encoding: str, name: str
) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    publish(root, encoding)
    pull(root, 0, local, durable=False)
    before = local_bytes(local / ck.version_dirname(0))
    tamper(root / ck.version_dirname(1), name)
    with pytest.raises(DigestMismatch):
        pull(root, 1, local, durable=False)
    assert [v.version for v in committed_versions(local)] == [0]
    assert local_bytes(local / ck.version_dirname(0)) == before
    assert not list(local.glob(".tmp-*"))


def test_pull_refuses_a_chain_whose_last_delta_is_corrupt(tmp_path: Path) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    states = publish(root, "xor", versions=2)
    tamper(root / ck.version_dirname(2), "few")
    with pytest.raises(DigestMismatch):
        pull(root, 2, local, durable=False)
    assert committed_versions(local) == [] and not list(local.glob(".tmp-*"))
    # The good prefix of the chain still pulls, to the exact bytes of v1.
    r = pull(root, 1, local, durable=False)
    assert r.chain == [0, 1]
    assert local_bytes(r.path) == {t.name: t.data.tobytes() for t in named_bytes(states[1].items())}
