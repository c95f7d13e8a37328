"""`rlgw serve` on first use (issue 13): a busy port fails at once in one line; every option has help."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from rlgw.bin.main import build_parser


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
