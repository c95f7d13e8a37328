"""Pulls at their edges: gaps and out-of-order deltas in the chain, stale staging left by a crash,
and what a pull reports, on real files (no engine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import write_delta_version
from rlgw.sync.errors import VersionError
from rlgw.sync.full import write_full_version
from rlgw.sync.pull import committed_versions, plan_chain, pull
from rlgw.sync.tensors import named_bytes


def states(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    out = [{"w": torch.randn(300, generator=g)}]
    for _ in range(n - 1):
        w = out[-1]["w"].clone()
        w[torch.randperm(300, generator=g)[:5]] += 1
        out.append({"w": w})
    return out


def delta(root: Path, version: int, base: int, new: dict, old: dict) -> None:
    index = ck.read_index(root / ck.version_dirname(base))
    olds = {t.name: t.data for t in named_bytes(old.items())}
    pairs = [(t, olds[t.name]) for t in named_bytes(new.items())]
    write_delta_version(root, version, index, pairs, "xor", durable=False)


def chain(root: Path, n: int) -> list[dict[str, torch.Tensor]]:
    """v0 full, then deltas v1..v(n-1), each on the one before."""
    s = states(n)
    write_full_version(root, 0, named_bytes(s[0].items()), durable=False)
    for v in range(1, n):
        delta(root, v, v - 1, s[v], s[v - 1])
    return s


def test_a_missing_delta_in_the_chain_is_named(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    chain(root, 4)
    shutil.rmtree(root / ck.version_dirname(2))
    with pytest.raises(VersionError, match="delta v2 is not published"):
        plan_chain(root, 3, 1)
    with pytest.raises(VersionError, match="delta v2 is not published"):
        plan_chain(root, 3, None)


def test_a_delta_on_the_wrong_base_is_an_out_of_order_chain(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    s = states(3)
    write_full_version(root, 0, named_bytes(s[0].items()), durable=False)
    delta(root, 1, 0, s[1], s[0])
    delta(root, 2, 0, s[2], s[0])  # v2 declares v0 as its base, not v1
    with pytest.raises(VersionError, match="out-of-order chain: v2 is a delta with base v0"):
        plan_chain(root, 2, 1)
    start, deltas = plan_chain(root, 1, None)
    assert start is not None and start.version == 0 and [d.version for d in deltas] == [1]


def test_a_newer_full_version_beats_an_older_local_checkpoint(tmp_path: Path) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    s = states(4)
    write_full_version(root, 0, named_bytes(s[0].items()), durable=False)
    delta(root, 1, 0, s[1], s[0])
    write_full_version(root, 2, named_bytes(s[2].items()), durable=False)
    delta(root, 3, 2, s[3], s[2])
    start, deltas = plan_chain(root, 3, 1)
    assert start is not None and start.version == 2 and [d.version for d in deltas] == [3]
    start, deltas = plan_chain(root, 3, 2)  # as new as the full one: start from the local copy
    assert start is None and [d.version for d in deltas] == [3]
    pull(root, 1, local, durable=False)
    r = pull(root, 3, local, durable=False)
    assert r.chain == [2, 3]


def test_no_full_version_and_no_local_checkpoint_cannot_start(tmp_path: Path) -> None:
    root = tmp_path / "pub"
    chain(root, 3)
    shutil.rmtree(root / ck.version_dirname(0))
    with pytest.raises(VersionError, match="no full version at or below v2"):
        plan_chain(root, 2, None)
    start, deltas = plan_chain(root, 2, 0)  # a local v0 is enough
    assert start is None and [d.version for d in deltas] == [1, 2]


def test_stale_staging_is_removed_and_a_pull_reports_what_it_did(tmp_path: Path) -> None:
    root, local = tmp_path / "pub", tmp_path / "local"
    chain(root, 3)
    stale = local / ".tmp-weight_v000009-123-456"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half written")
    r = pull(root, 2, local, durable=False)
    assert not stale.exists() and not r.already and r.chain == [0, 1, 2] and r.version == 2
    assert r.checkpoint_digest == ck.read_index(root / ck.version_dirname(2)).checkpoint_digest
    again = pull(root, 2, local, durable=False)
    assert again.already and again.path == r.path and again.checkpoint_digest == r.checkpoint_digest
    assert [v.version for v in committed_versions(local)] == [2]


def test_keep_local_below_two_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_local"):
        pull(tmp_path, 1, tmp_path / "local", keep_local=1)
