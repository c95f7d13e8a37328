"""A killed test run leaves no process behind (tests/support/reaper.py).

A pytest run in a subprocess, wired as the suite is (the root conftest), starts an embedded engine and
a PostgreSQL cluster in one test and holds them; this test then kills that pytest (SIGKILL: no cleanup
runs at all; SIGTERM: Python's default, no `finally` runs either) and waits for every process the run
started (found by a probe variable they all inherit) to be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.postgres import find_bin_dir
from tests.support.procs import REPO
from tests.support.reaper import alive, carrying, command, tree

pytestmark = pytest.mark.slow

HOLDER = """
import os, time
from pathlib import Path
from tests.support.postgres import cluster
from tests.support.procs import FIXTURES, engine_server

def test_hold():
    with engine_server(FIXTURES / "tiny-qwen3"), cluster() as pg:
        Path(os.environ["PROBE_READY"]).write_text(pg.url())
        time.sleep(600)
"""


@pytest.mark.skipif(find_bin_dir() is None, reason="needs PostgreSQL's initdb and pg_ctl")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_run_leaves_nothing(sig: signal.Signals, tmp_path: Path) -> None:
    probe = uuid.uuid4().hex
    ready = tmp_path / "ready"
    (tmp_path / "test_hold.py").write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE": probe, "PROBE_READY": str(ready)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "tests.conftest", "test_hold.py"]
    run = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert run.poll() is None, "the inner pytest run ended before its servers were up"
            assert time.monotonic() < deadline, "the inner run's engine and cluster did not start"
            time.sleep(0.2)
        started = tree(carrying("PROBE", probe) - {run.pid})
        commands = " ".join(command(pid) for pid, _ in started)
        for part in ("rlgw.bin.main engine", "postgres: checkpointer"):
            assert part in commands, commands
    finally:
        os.kill(run.pid, sig)
        run.wait()
    deadline = time.monotonic() + 30
    while (left := alive(started) | tree(carrying("PROBE", probe))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [command(pid) for pid, _ in left]
