"""`rlgw trajectories view`: the viewer on a store without a gateway, as a real subprocess."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np

from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.procs import FIXTURES, free_port, rlgw_process
from tests.support.viewer_samples import tool_conversation


def _store(tmp_path: Path) -> tuple[Path, int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-qwen3")
    sample = tool_conversation(tok, np.random.default_rng(5))

    async def fill() -> int:
        store = TrajectoryStore.open(tmp_path)
        (cursor,) = await store.add_samples("team-a", "sess-1", "weather-paris", [sample])
        await store.close()
        return cursor

    return tmp_path, asyncio.run(fill())


def test_view_serves_the_store_with_token_text(tmp_path: Path) -> None:
    data, cursor = _store(tmp_path)
    port = free_port()
    args = ["trajectories", "view", "--data-dir", str(data), "--port", str(port)]
    with rlgw_process([*args, "--tokenizer", str(FIXTURES / "tiny-qwen3")], "/ui", port) as url:
        listing = httpx.get(url + "/ui").text
        assert "weather-paris" in listing and f"/ui/runs/{cursor}" in listing
        page = httpx.get(f"{url}/ui/api/samples/{cursor}/tokens").json()
        assert "".join(page["text"]).startswith("<|im_start|>system\n")
        # Read-only: nothing in the viewer writes (no POST route but login/logout, and no keys here).
        assert httpx.post(url + "/ui/login", data={"key": "x"}).status_code == 401


def test_view_on_a_busy_port_or_missing_store_says_so(tmp_path: Path) -> None:
    missing = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "trajectories", "view", "--data-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no trajectory store" in missing.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "rlgw.bin.main", "trajectories", "view", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2 and f"127.0.0.1:{port}" in out.stderr
