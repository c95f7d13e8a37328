"""A real `rlgw serve` subprocess for the tenants, limits, metrics and operations tests.

Unlike `tests.support.procs.rlgw_process` it keeps the process's log file after the run (tests grep
the structured logs) and hands back the process itself (tests send it SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import free_port, wait_healthy


@dataclass
class Gateway:
    """A running gateway: its URL, process, data dir and log file."""

    url: str
    proc: subprocess.Popen
    data_dir: Path
    log_path: Path

    def logs(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")


def _spawn(engine_url: str, tmp: Path, args: tuple[str, ...], env: dict[str, str] | None) -> Gateway:
    port = free_port()
    data_dir = tmp / "data"
    log_path = tmp / f"gateway-{port}.log"
    cmd = [sys.executable, "-m", "rlgw.bin.main", "--log-level", "debug", "serve", "--engine-url", engine_url]
    cmd += ["--port", str(port), "--data-dir", str(data_dir), "--context-length", "256", *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    return Gateway(f"http://127.0.0.1:{port}", proc, data_dir, log_path)


def _stop(gw: Gateway) -> None:
    if gw.proc.poll() is None:
        gw.proc.terminate()
        try:
            gw.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gw.proc.kill()
            gw.proc.wait()


@contextlib.contextmanager
def gateway(engine_url: str, tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Gateway]:
    """`rlgw serve --engine-url ENGINE_URL ARGS` on a free port with its data dir under `tmp`."""
    with gateways(engine_url, [(tmp, args, env)]) as (gw,):
        yield gw


@contextlib.contextmanager
def gateways(
    engine_url: str, specs: list[tuple[Path, tuple[str, ...] | list[str], dict[str, str] | None]]
) -> Iterator[list[Gateway]]:
    """Several gateways, one per `(tmp, args, env)`, started at once (their start-ups overlap)."""
    started = [_spawn(engine_url, tmp, tuple(args), env) for tmp, args, env in specs]
    try:
        for gw in started:
            wait_healthy(gw.url + "/healthz", gw.proc, log=gw.log_path)
        yield started
    finally:
        for gw in started:
            _stop(gw)


@contextlib.contextmanager
def gateway_on_port(engine: str, data: Path, port: int) -> Iterator[subprocess.Popen]:
    """`rlgw serve` on `port` with its data dir `data`, as a process the test may kill -9 and start
    again on the same port and data (an agent's base URL stays valid); terminated at the end if alive."""
    args = ["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(data)]
    log = open(data / f"gateway-{port}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgw.bin.main", *args], stdout=log, stderr=subprocess.STDOUT, env=os.environ
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=15)
        log.close()
