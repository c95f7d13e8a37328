"""A real `sglang-router` (the dev extra's) in front of engine workers, for scale-out tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from tests.support.procs import free_port, terminate, wait_healthy


@contextlib.contextmanager
def router(workers: list[str]) -> Iterator[str]:
    """`sglang-router` with the manual (routing-key) policy in front of `workers`; yields its URL
    once the router counts every worker healthy (its `/health` answers before the workers
    are registered, and a key routed then can only land on the workers it already has)."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--policy", "manual", "--log-level", "warn"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", proc, timeout=120)
        _await_workers(url, len(workers))
        yield url
    finally:
        terminate(proc)


def _await_workers(url: str, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    seen: dict = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            seen = httpx.get(url + "/readiness", timeout=2.0).json()
            if seen.get("healthy_workers") == n:
                return
        time.sleep(0.2)
    raise TimeoutError(f"router at {url} never counted {n} healthy workers: last /readiness {seen}")
