"""Shared fixtures: paths of the committed test models; GPU and long-tier skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.procs import FIXTURES

# The throwaway PostgreSQL cluster's fixtures (`pg_cluster`, `pg_url`); per-test time bounds; the
# watchdog that kills whatever the run started once pytest is gone; the quick tier's marking; the
# workers' units of tests.
pytest_plugins = [
    "tests.support.postgres",
    "tests.support.timeouts",
    "tests.support.reaper",
    "tests.support.tiers",
    "tests.support.workers",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `long`-marked tests unless `RLGW_LONG=1`, and `gpu`-marked ones where no CUDA device exists."""
    if os.environ.get("RLGW_LONG") != "1":
        skip_long = pytest.mark.skip(reason="a long tier: set RLGW_LONG=1 to run it")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip_long)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_qwen3() -> Path:
    """The committed tiny Qwen3-style checkpoint (real Qwen3 chat template, small BPE)."""
    return FIXTURES / "tiny-qwen3"


@pytest.fixture(scope="session")
def tiny_chatml() -> Path:
    """The committed tiny ChatML checkpoint (SmolLM2's tokenizer and template)."""
    return FIXTURES / "tiny-chatml"
