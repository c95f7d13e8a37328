"""A fake ROCK admin server (see `server.py`) run as a real subprocess for tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import REPO, free_port, wait_healthy


@contextlib.contextmanager
def fake_rock(root: Path, *, api_key: str | None = None, startup_delay: float = 0.0) -> Iterator[str]:
    """Run the fake ROCK server on a free port; yield its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.fake_rock.server", "--port", str(port), "--root", str(root)]
    if api_key:
        argv += ["--api-key", api_key]
    argv += ["--startup-delay", str(startup_delay)]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + "/", proc, timeout=60)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
