"""The quick tier's rule (tests/support/tiers.py): a test that reaches a process starter is not quick."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.tiers import starters, starts_process

SOURCE = """
import subprocess
import multiprocessing as mp

from tests.support.procs import engine_server


def spawn_helper():
    return subprocess.run(["true"])


def test_engine():
    with engine_server("m"):
        pass


def test_through_a_helper():
    spawn_helper()


def test_aliased_module():
    mp.get_context("spawn")


def test_annotation_only(proc: subprocess.Popen | None = None):
    return proc


def test_pure():
    assert sorted([2, 1]) == [1, 2]
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):
    path: Path = tmp_path_factory.mktemp("tiers") / "sample_tests.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("sample_tests", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("name", "starts"),
    [
        ("test_engine", True),
        ("test_through_a_helper", True),
        ("test_aliased_module", True),
        ("test_annotation_only", False),
        ("test_pure", False),
    ],
)
def test_a_test_is_quick_unless_it_reaches_a_process(module, name: str, starts: bool) -> None:
    assert starts_process(getattr(module, name)) is starts


def test_support_helpers_that_start_servers_are_found() -> None:
    assert {"engine_server", "rlgw_process", "stack", "cluster", "gateway", "vllm_stack"} <= starters()
    assert not {"free_port", "serve_in_thread", "recording_proxy"} & starters()
