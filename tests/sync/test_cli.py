"""`rlgw sync publish|apply|gc` on real directories (the engine-facing actions are in test_engine_sync)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlgw.bin.main import main
from rlgw.sync import checkpoint as ck


def test_publish_delta_apply_locally_and_gc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "toy"}')
    state = {"w": torch.randn(64, 32), "e": torch.randn(10, 8).bfloat16()}
    save_file(state, str(ckpt / "model.safetensors"))
    root = tmp_path / "pub"
    assert (
        main(["sync", "publish", "--root", str(root), "--version", "1", "--from", str(ckpt), "--no-fsync"])
        == 0
    )
    state["w"][0, :3] += 1
    save_file(state, str(ckpt / "model.safetensors"))
    args = ["sync", "publish", "--root", str(root), "--version", "2", "--from", str(ckpt), "--kind", "delta"]
    assert main(args) == 0
    assert ck.read_index(root / "weight_v000002").kind == "delta"
    assert [p.name for p in root.iterdir() if not p.name.startswith("weight_v")] == []  # no scratch left

    local = tmp_path / "local"
    assert main(["sync", "apply", "--root", str(root), "--version", "2", "--local-dir", str(local)]) == 0
    loaded = load_file(str(local / "weight_v000002" / "model.safetensors"))
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert (local / "weight_v000002" / "config.json").read_text() == '{"model_type": "toy"}'

    # Out of order: republishing an older version, then a broken chain, are clear failures.
    assert main(["sync", "publish", "--root", str(root), "--version", "2", "--from", str(ckpt)]) == 1
    shutil.rmtree(root / "weight_v000002")
    assert (
        main(["sync", "apply", "--root", str(root), "--version", "2", "--local-dir", str(tmp_path / "l2")])
        == 1
    )
    assert "not published" in capsys.readouterr().out
    assert main(["sync", "gc", "--root", str(root), "--keep-full", "1"]) == 0
