"""Shared fixtures: paths of the committed test models, the gateway stacks on them; GPU and long-tier
skipping."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e import Stack, stack
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


@pytest.fixture(scope="session")
def qwen3(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`rlgw serve` in front of a recording proxy and `rlgw engine` on tiny-qwen3, started once for every
    module that only talks to it through its API: each test opens its own sessions and reads back its own
    samples (by session id, by engine rid in the recorder), so what other modules stored is not in its
    way."""
    with stack(tiny_qwen3, tmp_path_factory.mktemp("store-qwen3")) as s:
        yield s


@pytest.fixture(scope="session")
def chatml(tiny_chatml: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The same on tiny-chatml, the gateway parsing calls with the `hermes` tool parser."""
    with stack(tiny_chatml, tmp_path_factory.mktemp("store-chatml"), "--tool-parser", "hermes") as s:
        yield s
