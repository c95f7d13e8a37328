"""The gateway and engine a training run talks to: given URLs, or a local `rlgw serve` it starts.

The local one is `rlgw serve --model M` (the gateway plus the embedded engine, as a newcomer runs
it), in a child process whose output goes to a log file; it is stopped when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True, slots=True)
class Services:
    """Where the run's gateway and engines are."""

    gateway_url: str
    gateway_key: str | None
    engine_urls: list[str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"rlgw serve exited with code {proc.returncode} before it was ready:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s (see {log})")


@contextlib.contextmanager
def local_services(
    model: str,
    work_dir: Path,
    *,
    engine_threads: int = 1,
    cache_mib: int | None = None,
    timeout: float = 300.0,
) -> Iterator[Services]:
    """Start `rlgw serve --model MODEL` with its store under `work_dir`; yields the URLs, stops it after.

    `cache_mib` is the embedded engine's prefix-cache budget (`--cache-mib`; None: serve's default, 0: off).
    """
    port, engine_port = _free_port(), _free_port()
    log_path = work_dir / "serve.log"
    cmd = [
        sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "serve", "--model", model,
        "--port", str(port), "--engine-port", str(engine_port), "--engine-threads", str(engine_threads),
        "--data-dir", str(work_dir / "store"),
    ]  # fmt: skip
    if cache_mib is not None:
        cmd += ["--cache-mib", str(cache_mib)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, log_path, timeout)
        yield Services(f"http://127.0.0.1:{port}", None, [f"http://127.0.0.1:{engine_port}"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
