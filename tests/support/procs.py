"""Real subprocesses for tests: the embedded engine and the gateway, on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180.0, log: Path | None = None) -> None:
    """Poll `url` until it answers 200; fail with the process's output if it dies or times out.

    The output comes from `proc.stdout` when it is a pipe, else from the file `log` it writes to.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.stdout:
                out = proc.stdout.read()
            else:
                out = log.read_text(errors="replace")[-20000:] if log else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was healthy:\n{out}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"{url} not healthy after {timeout}s")


def terminate(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM `proc` and wait for it; SIGKILL it if it is still there after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def rlgw_process(args: list[str], health_path: str, port: int, env: dict | None = None) -> Iterator[str]:
    """Run `rlgw ARGS` (which must listen on `port`) and yield its base URL until the block ends.

    The child's output goes to a temporary file, not a pipe: a pipe nobody reads fills up and stalls a
    chatty process mid-test. The file's tail is shown if the process dies before it is healthy.
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with tempfile.NamedTemporaryFile(prefix="rlgw-proc-", suffix=".log", delete=False) as log_file:
        log = Path(log_file.name)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlgw.bin.main", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + health_path, proc, log=log)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port in a daemon thread; yields its URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise TimeoutError("the in-thread server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def engine_server(model: str | Path, *extra: str) -> Iterator[str]:
    """The embedded engine serving `model` in a subprocess; yields its base URL."""
    port = free_port()
    with rlgw_process(["engine", "--model", str(model), "--port", str(port), *extra], "/health", port) as url:
        yield url
