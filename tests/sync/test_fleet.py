"""The fleet check's rules (pure), and the shared-memory carrier's validation (no engine)."""

from __future__ import annotations

import base64

import pytest
import torch

from rlgw.sync.colocated import ShmSender, decode_manifest, encode_manifest, open_manifest
from rlgw.sync.errors import FleetMismatch, TransferError
from rlgw.sync.fleet import EngineStatus, check_fleet, fleet_problems


def test_agreeing_fleet_passes_and_every_disagreement_is_named() -> None:
    ok = [EngineStatus(f"http://e{i}", "5", "cd", "live") for i in range(3)]
    check_fleet(ok, "5", "cd")
    bad = [
        EngineStatus("http://e0", "5", "cd", "live"),
        EngineStatus("http://e1", "4", "cd", "live"),
        EngineStatus("http://e2", "5", "other", "live"),
        EngineStatus("http://e3", error="ConnectError"),
    ]
    problems = fleet_problems(bad, "5", "cd")
    assert len(problems) == 3 and "e1" in problems[0] and "e2" in problems[1] and "e3" in problems[2]
    with pytest.raises(FleetMismatch):
        check_fleet(bad, "5")


def test_same_version_with_different_live_bytes_is_a_mismatch() -> None:
    fleet = [EngineStatus("http://a", "5", None, "x"), EngineStatus("http://b", "5", None, "y")]
    assert "different live weights" in fleet_problems(fleet, "5")[0]
    split = [EngineStatus("http://a", "5"), EngineStatus("http://b", "6")]
    assert "different versions" in fleet_problems(split)[0]


def test_shared_memory_round_trip_and_validation() -> None:
    named = [
        ("a", torch.randn(3, 4)),
        ("b", torch.arange(5, dtype=torch.int64)),
        ("c", torch.randn(2).bfloat16()),
    ]
    sender = ShmSender()
    try:
        manifest = decode_manifest(encode_manifest(sender.pack(named)))
        opened = open_manifest(manifest)
        try:
            assert [(n, t.dtype, t.shape) for n, t in opened.named] == [
                (n, t.dtype, t.shape) for n, t in named
            ]
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(opened.named, named, strict=True))
        finally:
            opened.close()
        manifest["tensors"][1]["offset"] = manifest["size"] - 8  # points past the block's end
        with pytest.raises(TransferError, match="outside the block"):
            open_manifest(manifest)
        manifest["shm"] = "../etc/passwd"
        with pytest.raises(TransferError, match="not an rlgw block"):
            open_manifest(manifest)
    finally:
        sender.close()
    with pytest.raises(TransferError, match="base64 JSON"):
        decode_manifest(base64.b64encode(b"\x80\x04K\x01.").decode())  # a pickle
