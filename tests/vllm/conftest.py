"""A real vLLM server (`tests/support/vllm_env.py`) on the tiny fixtures with 64-wide heads
(`tests/support/wide_heads.py`), a recording proxy and the gateway in front of it: one stack per
fixture for the tier, since vLLM takes minutes to start on CPU; stopped when the tier ends (its worker
busy-polls while idle)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e import Stack
from tests.support.vllm_env import vllm_python, vllm_stack
from tests.support.wide_heads import widen_heads


@pytest.fixture(scope="package")
def qwen3_hd64(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with 64-wide heads and its own LM head: what the session's vLLM serves (and trains)."""
    return widen_heads(tiny_qwen3, tmp_path_factory.mktemp("fixtures") / "tiny-qwen3-hd64", untie=True)


@pytest.fixture(scope="package")
def vllm_qwen3(qwen3_hd64: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    vllm_python()  # skips (naming the command that builds it) where the vLLM venv is not built
    with vllm_stack(qwen3_hd64, tmp_path_factory.mktemp("vllm-qwen3")) as st:
        yield st
