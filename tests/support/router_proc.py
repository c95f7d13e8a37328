"""A real `sglang-router` (the dev extra's) in front of engine workers, for scale-out tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from tests.support.procs import free_port, wait_healthy


@contextlib.contextmanager
def router(workers: list[str]) -> Iterator[str]:
    """`sglang-router` with the manual (routing-key) policy in front of `workers`; yields its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--policy", "manual", "--log-level", "warn"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", proc, timeout=120)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
