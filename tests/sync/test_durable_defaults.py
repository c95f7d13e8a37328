"""Published and pulled versions are fsynced unless a caller opts out: a version a trainer or an
engine was told about must survive a power cut, and only tests and benches pass durable=False."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlgw.sync.delta import write_delta_version
from rlgw.sync.full import write_full_version
from rlgw.sync.pull import pull
from rlgw.sync.tensors import named_bytes
from tests.sync.test_pull import published  # noqa: F401 - the fixture

BASE = {"w": torch.arange(64, dtype=torch.float32)}


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fsync made (files and directories), by file descriptor."""
    calls: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def _delta(root: Path, **kw: bool) -> None:
    old = {t.name: t.data for t in named_bytes(BASE.items())}
    b0 = write_full_version(root, 0, named_bytes(BASE.items()), durable=False)
    new = {"w": BASE["w"] + 1}
    write_delta_version(root, 1, b0, [(t, old[t.name]) for t in named_bytes(new.items())], **kw)


def test_a_delta_version_is_fsynced_by_default(tmp_path: Path, fsyncs: list[int]) -> None:
    _delta(tmp_path / "default")
    by_default = len(fsyncs)
    fsyncs.clear()
    _delta(tmp_path / "opted-out", durable=False)
    # Opting out skips the tensors' file and the directories (the small index is always synced).
    assert by_default > len(fsyncs)


def test_a_pulled_version_is_fsynced_by_default(published, tmp_path: Path, fsyncs: list[int]) -> None:  # noqa: F811
    root, _ = published
    fsyncs.clear()
    pull(root, 5, tmp_path / "local")
    by_default = len(fsyncs)
    fsyncs.clear()
    pull(root, 5, tmp_path / "other", durable=False)
    assert by_default > len(fsyncs)
