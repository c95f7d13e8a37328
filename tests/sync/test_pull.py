"""Host-local pulls: chain planning, retention, recycling, and the no-op on a repeated target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync.errors import VersionError
from rlgw.sync.publisher import WeightPublisher
from rlgw.sync.pull import committed_versions, plan_chain, pull
from rlgw.sync.stfile import SafetensorsFile
from rlgw.sync.tensors import tensor_bytes


def step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (v + (torch.rand(v.shape, generator=g) < 0.01) * 0.25).to(v.dtype) for k, v in state.items()}


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, list[dict[str, torch.Tensor]]]:
    """v1 full, v2-v3 deltas, v4 full, v5-v6 deltas (full_every=3), keeping 2 full versions."""
    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(64, 64, generator=g), "b": torch.randn(100, generator=g).to(torch.bfloat16)}
    pub = WeightPublisher(tmp_path / "pub", full_every=3, durable=False)
    history = [state]
    for v in range(1, 7):
        pub.publish(state.items(), v)
        state = step(state, v)
        history.append(state)
    return tmp_path / "pub", history[:-1]  # history[v-1] is version v


def content(vdir: Path) -> dict[str, bytes]:
    with SafetensorsFile(vdir / "model.safetensors") as sf:
        return {n: bytes(sf.raw(n)) for n in sf.entries}


def expect(state: dict[str, torch.Tensor]) -> dict[str, bytes]:
    return {k: tensor_bytes(v).tobytes() for k, v in state.items()}


def test_retention_and_chain_plans(published) -> None:
    root, _ = published
    kinds = [(v.version, v.kind) for v in ck.list_versions(root)]
    assert kinds == [(1, "full"), (4, "full"), (5, "delta"), (6, "delta")]
    start, deltas = plan_chain(root, 6, None)
    assert start.version == 4 and [d.version for d in deltas] == [5, 6]
    start, deltas = plan_chain(root, 6, 5)  # the local checkpoint is newer than the full one
    assert start is None and [d.version for d in deltas] == [6]
    with pytest.raises(VersionError, match="not published"):
        plan_chain(root, 3, None)


def test_pull_chain_then_step_then_noop(published, tmp_path: Path) -> None:
    root, history = published
    local = tmp_path / "local"
    r = pull(root, 5, local, durable=False)
    assert r.chain == [4, 5] and content(r.path) == expect(history[4])
    r = pull(root, 6, local, durable=False)
    assert r.chain == [6] and content(r.path) == expect(history[5])
    again = pull(root, 6, local, durable=False)
    assert again.already and again.chain == [] and content(again.path) == expect(history[5])
    assert [v.version for v in committed_versions(local)] == [5, 6]
    with pytest.raises(VersionError, match="newer than the requested"):
        pull(root, 4, local, durable=False)


def test_pull_recycles_the_retired_version(published, tmp_path: Path) -> None:
    root, history = published
    local = tmp_path / "local"
    pull(root, 4, local, durable=False)
    pull(root, 5, local, durable=False)
    inode = (local / "weight_v000004" / "model.safetensors").stat().st_ino
    r = pull(root, 6, local, durable=False)
    # v4's file was overwritten in place to become v6 (its pages reused), v5 stayed the base.
    assert (r.path / "model.safetensors").stat().st_ino == inode
    assert content(r.path) == expect(history[5])
    assert [v.version for v in committed_versions(local)] == [5, 6]


def test_full_version_without_local_dir_is_verified_in_place(published) -> None:
    root, _ = published
    r = pull(root, 4, None)
    assert r.path == root / "weight_v000004"
    with pytest.raises(Exception, match="full"):
        pull(root, 5, None)
