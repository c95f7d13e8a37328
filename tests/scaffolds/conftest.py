"""The gateway the real-agent runs talk to: `rlgw serve` (capture) in front of `rlgw engine` on tiny Qwen3."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import engine_server, free_port, rlgw_process


@pytest.fixture(scope="session")
def real_gateway(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory):
    """A gateway URL, shared by every real-agent test of the session (started on first use)."""
    if not (tiny_qwen3 / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    data = tmp_path_factory.mktemp("real-gw")
    with engine_server(tiny_qwen3) as engine:
        port = free_port()
        args = ["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(data)]
        with rlgw_process(args, "/health", port) as url:
            yield url
