"""How an installed scaffold gets its own Python environment inside a sandbox.

Agents that need another Python than the sandbox's (OpenHands and harbor need 3.12) live in
their own virtual environment, built with `uv`. The install is one shell command that does
nothing when the environment already passes its check (a prepared image, or a venv cached
between runs on a local sandbox), so a run pays for the install only once. This module
knows nothing about sandboxes or any particular agent.
"""

from __future__ import annotations

import shlex

# uv installs itself into ~/.local/bin.
UV_PATH = 'export PATH="$HOME/.local/bin:$PATH"'
UV_INSTALLER = "curl -LsSf https://astral.sh/uv/install.sh | sh"


def uv_install(venv: str, requirement: str, check: str, *, python: str = "3.12") -> str:
    """A shell command: nothing if `check` succeeds, else a `python` venv at `venv` with `requirement`."""
    v = shlex.quote(venv)
    return (
        f"{check} >/dev/null 2>&1 || ({UV_PATH}; (command -v uv >/dev/null || {UV_INSTALLER}) && "
        f"(test -x {v}/bin/python || uv venv {v} --python {python}) && "
        f"uv pip install --python {v}/bin/python {shlex.quote(requirement)})"
    )


def version_check(distribution: str, version: str) -> str:
    """Python source that exits 0 only if `distribution` is installed at exactly `version`."""
    return f"import importlib.metadata as m, sys; sys.exit(m.version({distribution!r}) != {version!r})"
