"""The `Sandbox` protocol every backend implements, its result type and its errors.

A sandbox is a place to run shell commands and keep files for one task run: start it,
exec commands (each with a wall-clock limit, environment and working directory), move
files in and out, stop it. This module owns only that shape; it knows nothing about
agents, gateways or how a backend isolates anything.

SandboxError
├── SandboxStartError      the sandbox could not be created or never became ready
├── SandboxCommandError    the backend failed to carry out an operation (not: the command exited non-zero)
└── SandboxFileNotFound    a file or directory asked for does not exist in the sandbox

A command that runs past its limit is not an error: `ExecResult.timed_out` says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


class SandboxError(Exception):
    """Base of every error a sandbox backend raises."""


class SandboxStartError(SandboxError):
    """The sandbox could not be created or did not become ready in time."""


class SandboxCommandError(SandboxError):
    """The backend failed to carry out an operation (transport, API or filesystem failure)."""


class SandboxFileNotFound(SandboxError):
    """The path asked for does not exist in the sandbox."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How one command ended.

    `exit_code` is None when the command was killed for running past its limit
    (`timed_out` is then True). `output` holds stdout followed or interleaved with stderr,
    as the backend can provide it.
    """

    exit_code: int | None
    output: str
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the command finished in time with exit code 0."""
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """One isolated (or, for the local backend without bubblewrap, not isolated) workspace.

    `workdir` is the absolute path inside the sandbox where the task's files live; relative
    paths given to the file methods are resolved against it. `scratch` is an absolute path for
    the runner's own files (installed agents, logs, rewards), kept out of the workspace so it
    does not end up in the frozen artifact. Both are valid after `start()`.
    """

    @property
    def id(self) -> str:
        """A backend-assigned identifier, for logs."""
        ...

    @property
    def workdir(self) -> str: ...

    @property
    def scratch(self) -> str: ...

    async def start(self) -> None:
        """Create the sandbox and wait until commands can run in it."""
        ...

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's limit inside the sandbox, not a cancel scope)
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `command` with bash; `cwd` defaults to `workdir`; `env` is added to the sandbox's own."""
        ...

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Create or replace a file (parents are created)."""
        ...

    async def read_file(self, path: str) -> bytes:
        """The whole content of a file; `SandboxFileNotFound` if it does not exist."""
        ...

    async def upload(self, local: Path, remote: str) -> None:
        """Copy a local file or directory to `remote` (a directory is copied as `remote`)."""
        ...

    async def download(self, remote: str, local: Path) -> None:
        """Copy a sandbox file or directory to `local` (a directory is copied as `local`)."""
        ...

    async def stop(self) -> None:
        """Tear the sandbox down; idempotent and safe to call after a failed `start()`."""
        ...


def resolve(workdir: str, path: str) -> str:
    """`path` if absolute, else `path` under `workdir` (POSIX paths inside the sandbox)."""
    return path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
