"""A fake ROCK admin server (see `server.py`) run as a real subprocess for tests, and ROCK's real rocklet.

`real_rocklet` runs ROCK's own in-sandbox server (`rock.rocklet.server` from `rl-rock[rocklet]`)
from a virtual environment cached under `~/.cache/rlgw/agents/` (its own: the rocklet extra pins
numpy and pulls twisted, which the project's environment must not get), with ROCK's 85 s request
cut shortened for tests. Building that venv takes minutes, so it is built only with
RLGW_INSTALL_AGENTS=1 (the test skips until then).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.agent_venvs import agent_venv
from tests.support.procs import REPO, free_port, wait_healthy

ROCK_VERSION = "1.11.0"
# Imports the rocklet, shortens its request cut (a module global its middleware reads), serves it.
_ROCKLET_MAIN = (
    "import sys, uvicorn, rock.rocklet.server as s; s.REQUEST_TIMEOUT_SECONDS = float(sys.argv[2]); "
    "uvicorn.run(s.app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')"
)


@contextlib.contextmanager
def _served(argv: list[str], health: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    # Output goes to a file: a pipe nobody drains would block a chatty server (the rocklet logs
    # every request) once it fills.
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_healthy(health, proc, timeout=90)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fake_rock(
    root: Path,
    *,
    api_key: str | None = None,
    startup_delay: float = 0.0,
    request_cut: float | None = None,
    rocklet_url: str | None = None,
) -> Iterator[str]:
    """Run the fake ROCK server on a free port; yield its base URL."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.fake_rock.server", "--port", str(port), "--root", str(root),
            "--startup-delay", str(startup_delay)]  # fmt: skip
    if api_key:
        argv += ["--api-key", api_key]
    if request_cut is not None:
        argv += ["--request-cut", str(request_cut)]
    if rocklet_url:
        argv += ["--rocklet-url", rocklet_url]
    base = f"http://127.0.0.1:{port}"
    root.mkdir(parents=True, exist_ok=True)
    with _served(argv, base + "/", REPO, {**os.environ, "PYTHONUNBUFFERED": "1"}, root / "fake-rock.log"):
        yield base


@contextlib.contextmanager
def real_rocklet(workdir: Path, *, request_cut: float) -> Iterator[str]:
    """ROCK's own rocklet server on a free port, its cut set to `request_cut` seconds; yields its URL."""
    venv = agent_venv(
        "rocklet", ROCK_VERSION, [f"rl-rock[rocklet]=={ROCK_VERSION}"], python="3.11", opt_in=True
    )
    port = free_port()
    argv = [str(venv / "bin" / "python"), "-c", _ROCKLET_MAIN, str(port), str(request_cut)]
    # The rocklet writes access logs into its working directory's `logs/`.
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONUNBUFFERED": "1"}
    base = f"http://127.0.0.1:{port}"
    with _served(argv, base + "/", workdir, env, workdir / "rocklet.log"):
        yield base
