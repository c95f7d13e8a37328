"""`rlgw serve` on first use (issue 13): a busy port fails at once in one line; every option has help;
and a stopped or killed `rlgw serve` leaves no embedded engine behind."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rlgw.bin.main import build_parser
from tests.support.procs import free_port, wait_healthy

TINY = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-qwen3")


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction) and not a.help
    ]


def test_every_serve_and_trajectories_option_has_help() -> None:
    parser = build_parser()
    for path in (("serve",), ("trajectories", "show"), ("trajectories", "export"), ("trajectories", "view")):
        assert _options_without_help(_subparser(parser, *path)) == [], path
    port = next(a for a in _subparser(parser, "serve")._actions if "--port" in a.option_strings)
    assert "8000" in port.help


def test_a_busy_port_fails_before_anything_loads(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {
            **os.environ,
            "RLGW_CACHE_DIR": str(tmp_path / "cache"),
            "RLGW_DATA_DIR": str(tmp_path / "data"),
        }
        start = time.monotonic()
        # No --engine-url: without the check this would start the embedded engine (and convert SmolLM2).
        out = subprocess.run(
            [sys.executable, "-m", "rlgw.bin.main", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        elapsed = time.monotonic() - start
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], out.stderr
    assert "engine" not in out.stderr and "gateway on" not in out.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "data").exists()
    assert elapsed < 30  # interpreter start only; the engine would take minutes


@contextlib.contextmanager
def _serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """`rlgw serve` on the tiny model with its embedded engine; yields it and the engine's pid."""
    port, engine_port = free_port(), free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "serve", "--model", TINY,
         "--port", str(port), "--engine-port", str(engine_port), "--engine-threads", "1",
         "--data-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", serve, timeout=180)
        engine = _listener(engine_port)
        assert engine is not None and _alive(engine)
        yield serve, engine
    finally:
        serve.kill()


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pid)


def test_a_stopped_gateway_takes_its_embedded_engine_with_it(tmp_path) -> None:
    # uvicorn raises SIGTERM again after its graceful shutdown, so `rlgw serve` dies by the signal
    # and its own cleanup never runs: the engine must end because its parent did.
    with _serving(tmp_path) as (serve, engine):
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        assert _gone_soon(engine), "the embedded engine outlived rlgw serve"


def test_a_killed_gateway_takes_its_embedded_engine_with_it_too(tmp_path) -> None:
    with _serving(tmp_path) as (serve, engine):
        serve.kill()
        serve.wait(timeout=30)
        assert _gone_soon(engine), "the embedded engine outlived a killed rlgw serve"


def _listener(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:`port` (from /proc: no psutil here)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inode = fields[9]
    if inode is None:
        return None
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return int(fd_dir.parent.name)
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_store_and_journal_take_only_postgresql_urls() -> None:
    for flag in ("--store", "--journal"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlgw.bin.main",
                "serve",
                "--engine-url",
                "http://127.0.0.1:9",
                flag,
                "/x",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and f"{flag} takes a postgresql:// URL, got '/x'" in out.stderr
