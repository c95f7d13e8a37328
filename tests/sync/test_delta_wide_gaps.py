"""Sparse payloads of huge tensors store their position gaps as uint64. A tensor of 2**32
elements is out of a test's reach, so the threshold is lowered: the wide path is the same code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard as zstd

from rlgw.sync import checkpoint as ck
from rlgw.sync import delta
from rlgw.sync.delta import DELTA_FILE, apply_delta, write_delta_version
from rlgw.sync.full import write_full_version
from rlgw.sync.stfile import SafetensorsFile
from rlgw.sync.tensors import named_bytes

BASE = {"w": torch.arange(64, dtype=torch.float32)}


def _new() -> dict[str, torch.Tensor]:
    new = BASE["w"].clone()
    new[[3, 40, 63]] = torch.tensor([-1.0, -2.0, -3.0])  # 3 of 64 change: sparse
    return {"w": new}


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize(("wide_from", "gap_bytes"), [(64, 8), (65, 4)])
def test_sparse_gaps_are_wide_from_the_threshold_and_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str, wide_from: int, gap_bytes: int
) -> None:
    monkeypatch.setattr(delta, "WIDE_GAPS_FROM", wide_from)
    old = {t.name: t.data for t in named_bytes(BASE.items())}
    b0 = write_full_version(tmp_path, 0, named_bytes(BASE.items()), durable=False)
    pairs = [(t, old[t.name]) for t in named_bytes(_new().items())]
    version = write_delta_version(tmp_path, 1, b0, pairs, encoding, durable=False)
    rec = version.tensors["w"]
    assert rec.layout == "sparse" and rec.count == 3
    with SafetensorsFile(tmp_path / ck.version_dirname(1) / DELTA_FILE) as sf:
        raw = zstd.ZstdDecompressor().decompress(bytes(sf.raw("w")))
    assert len(raw) == 3 * (gap_bytes + 4)
    gaps = np.frombuffer(raw, dtype=np.uint64 if gap_bytes == 8 else np.uint32, count=3)
    assert gaps.tolist() == [4, 37, 23]  # positions 3, 40, 63 as gaps from -1
    out = tmp_path / "out"
    out.mkdir()
    apply_delta(tmp_path / ck.version_dirname(0), tmp_path / ck.version_dirname(1), out)
    with SafetensorsFile(out / "model.safetensors") as sf:
        assert bytes(sf.raw("w")) == _new()["w"].numpy().tobytes()
