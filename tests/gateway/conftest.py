"""Fixtures shared by the gateway tests: a scripted engine with a gateway on it (the HTTP contract), per
module. The real engine + recording proxy + gateway stacks on both fixtures (`qwen3`, `chatml`) are the
run's, in `tests/conftest.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.procs import free_port, rlgw_process

KEYS = "team-a:key-a-0123456789,team-b:key-b-0123456789"


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data = tmp_path_factory.mktemp("store")
    args = [
        "serve",
        "--engine-url",
        fe.url,
        "--port",
        str(port),
        "--data-dir",
        str(data),
        "--context-length",
        "256",
    ]
    with rlgw_process(args, "/health", port, env={"RLGW_TENANT_KEYS": KEYS}) as url:
        yield url
