"""The real SGLang (`tests/support/sglang_env.py`) on tiny-qwen3 with the recording proxy and the gateway
in front of it: ONE stack for the tier, shared by its modules (SGLang starts in 17-50 s), stopped when the
tier ends (its scheduler busy-polls about half a core while idle)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e import Stack
from tests.support.sglang_env import sglang_python, sglang_stack


@pytest.fixture(scope="package")
def sglang_qwen3(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """SGLang serving a copy of tiny-qwen3 (weight-sync tests rewrite its files), and the gateway."""
    sglang_python()  # skips, naming the build command, before anything starts
    root = tmp_path_factory.mktemp("sglang-qwen3")
    model = shutil.copytree(tiny_qwen3, root / "model")
    with sglang_stack(model, root) as st:
        yield st
