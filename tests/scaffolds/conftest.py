"""The gateway the real-agent runs talk to: `rlgw serve` (capture) in front of `rlgw engine` on tiny Qwen3.

The fixture model's config says 8192 positions; OpenHands V1's default prompt with its tool
schemas alone is about 12.4k tokens in the fixture's 4k-token vocabulary, so the runs use a
copy whose config allows 32768 (the tiny model's rotary embeddings extend; its output is noise
either way).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.e2e import stack
from tests.support.procs import FIXTURES, engine_server, free_port, rlgw_process

CONTEXT = 32768


@pytest.fixture(scope="package")
def real_gateway(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory):
    """A gateway URL, shared by every real-agent test of tests/scaffolds (started on first use)."""
    if not (tiny_qwen3 / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    data = tmp_path_factory.mktemp("real-gw")
    model = tmp_path_factory.mktemp("tiny-qwen3-32k")
    for f in tiny_qwen3.iterdir():
        shutil.copy(f, model / f.name)
    config = json.loads((tiny_qwen3 / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    with engine_server(model) as engine:
        port = free_port()
        args = ["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(data)]
        with rlgw_process(args, "/health", port) as url:
            yield url


@pytest.fixture(scope="package")
def agent_stack(tmp_path_factory: pytest.TempPathFactory):
    """Engine on tiny-agent, the recording proxy and `rlgw serve` (the CLIs' prompts need its 64k context)."""
    model = FIXTURES / "tiny-agent"
    if not (model / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-agent is not built (python -m tests.fixtures.build_agent_fixture)")
    with stack(model, tmp_path_factory.mktemp("cli-gw")) as st:
        yield st
