"""Virtual environments for real agents, built from PyPI on first use and cached per user.

Each agent (harbor for Terminus-2, `openhands`, `openhands-ai`, ROCK's rocklet) needs its own
interpreter and dependency set, so each gets `~/.cache/rlgw/agents/<name>-<version>`
(`RLGW_AGENT_CACHE` overrides the root), built once under a file lock and marked ready only
after its install succeeded. A test that needs a Python this machine lacks is skipped.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from rlgw.scaffolds.install import venv_marker
from rlgw.scaffolds.locks import Lock

READY = ".rlgw-ready"


def cache_root() -> Path:
    """Where agent environments live."""
    return Path(os.environ.get("RLGW_AGENT_CACHE", Path.home() / ".cache" / "rlgw" / "agents"))


def find_python(version: str) -> str | None:
    """An interpreter for `version` (e.g. "3.12") that runs: on PATH, else from pyenv's versions.

    A pyenv shim on PATH exits 127 when its version is not the selected one, so each
    candidate is tried before it is taken.
    """
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    installed = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for candidate in (shutil.which(f"python{version}"), *installed):
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


def agent_venv(name: str, version: str, requirements: list[str], *, python: str = "3.12",
               timeout_s: float = 1800, opt_in: bool = False, opt_in_var: str = "RLGW_INSTALL_AGENTS",
               no_deps: list[str] | None = None, imports: Sequence[str] = ()) -> Path:  # fmt: skip
    """The ready venv for `name`-`version` (built with `requirements` if missing); skips without `python`.

    `opt_in`: an install too slow for every CI run (OpenHands: 5-10 minutes) is built only when
    `opt_in_var` is 1; otherwise a missing venv skips the test, naming the variable. `no_deps`:
    packages installed after `requirements` without their dependencies (whose metadata pulls far
    more than what the tests import). `imports`: modules that must import before the venv is marked ready.
    """
    venv = cache_root() / f"{name}-{version}"
    if (venv / READY).exists():
        return venv
    if opt_in and os.environ.get(opt_in_var) != "1":
        pytest.skip(f"{venv} is not built; {opt_in_var}=1 builds it ({' '.join(requirements)})")
    interpreter = find_python(python)
    if interpreter is None:
        pytest.skip(f"{name} needs Python {python}, not found on PATH or in pyenv")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{name}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building the same venv
        if (venv / READY).exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
        started = time.monotonic()
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        for args in [requirements] + ([["--no-deps", *no_deps]] if no_deps else []):
            done = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"installing {args} into {venv} failed:\n{done.stderr[-3000:]}")
        if imports:
            probe = "; ".join(f"import {m}" for m in imports)
            done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{venv} installed but does not import:\n{done.stderr[-3000:]}")
        extra = f" --no-deps {' '.join(no_deps)}" if no_deps else ""
        (venv / READY).write_text(
            f"{' '.join(requirements)}{extra}\ninstalled in {time.monotonic() - started:.0f}s\n"
        )
    return venv


def locked_venv(name: str, lock: Lock, imports: Sequence[str], *, opt_in: bool = False) -> Path:
    """The ready venv of an agent's committed lock, installed as its scaffold does (`--no-deps -r`, imports).

    The directory is named for the lock's digest, so a changed lock builds a new venv; it carries the
    scaffold's own marker for that lock, so the scaffold's install step finds it ready.
    """
    requirements = ["--no-deps", "-r", str(lock.path)]
    venv = agent_venv(name, f"{lock.version}-{lock.digest()}", requirements, imports=imports, opt_in=opt_in)
    Path(venv_marker(str(venv), lock.digest())).touch()
    return venv
