"""The local sandbox: a temporary directory and subprocesses, optionally under bubblewrap.

This is the embedded default: nothing to install, fast to start. Without bubblewrap it
isolates nothing: commands run as the current user with the full host filesystem and
network; the sandbox is only a private working directory and a process group that is
killed on timeout and on stop. With `bwrap` installed (and `isolation="auto"` or
`"bubblewrap"`), commands run with a read-only host root, a private /tmp, a writable
sandbox directory and their own PID namespace; the network stays shared because the agent
must reach the gateway on loopback.

Every command carries `RLGW_SANDBOX=<id>` in its environment, and `stop()` kills every
process that still carries it: agents start daemons that leave their process group and
session (tmux servers, jupyter kernels), and those must not outlive the sandbox.

This module knows nothing about agents or tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from rlgw.sandboxes.base import (
    ExecResult,
    SandboxCommandError,
    SandboxError,
    SandboxFileNotFound,
    SandboxStartError,
    resolve,
)

log = logging.getLogger(__name__)

Isolation = Literal["auto", "none", "bubblewrap"]

# Output kept per command; an agent that prints gigabytes must not take the runner down.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
# Grace between SIGTERM and SIGKILL for a command past its limit.
KILL_GRACE_S = 2.0
# Re-reads (and the pause before each) of a process whose environment read empty: mid-exec.
EXEC_REREADS = 20
EXEC_REREAD_S = 0.01
# The environment variable that marks every process a sandbox started (inherited by daemons).
MARKER = "RLGW_SANDBOX"


class LocalSandbox:
    """A private temp directory plus subprocesses in their own process groups.

    Features: per-command wall-clock limits that kill the whole process group, output
    capped at 16 MiB per command, `HOME` pointed into the sandbox, optional bubblewrap.
    Trade-off: without bubblewrap (`isolation == "none"`) it is a convenience, not a
    security boundary; `isolation` reports which one you got.
    """

    def __init__(self, *, isolation: Isolation = "auto", base_dir: Path | None = None, keep: bool = False):
        bwrap = shutil.which("bwrap")
        if isolation == "bubblewrap" and bwrap is None:
            raise SandboxStartError("isolation='bubblewrap' was asked for but `bwrap` is not installed")
        self._bwrap = bwrap if isolation in ("auto", "bubblewrap") else None
        self._base_dir = base_dir
        self._keep = keep
        self._id = f"local-{uuid.uuid4().hex[:12]}"
        self._root: Path | None = None
        self._procs: set[asyncio.subprocess.Process] = set()

    @property
    def id(self) -> str:
        return self._id

    @property
    def isolation(self) -> str:
        """`"bubblewrap"` when commands run under bwrap, else `"none"`."""
        return "bubblewrap" if self._bwrap else "none"

    @property
    def root(self) -> Path:
        """The host directory that holds this sandbox (workdir and scratch live under it)."""
        if self._root is None:
            raise SandboxError("sandbox not started")
        return self._root

    @property
    def workdir(self) -> str:
        return str(self.root / "workspace")

    @property
    def scratch(self) -> str:
        return str(self.root / "rlgw")

    async def start(self) -> None:
        """Create the sandbox directory tree."""
        try:
            root = Path(tempfile.mkdtemp(prefix="rlgw-sbx-", dir=self._base_dir))
            for sub in ("workspace", "rlgw", "home", "tmp"):
                (root / sub).mkdir()
        except OSError as e:
            raise SandboxStartError(f"cannot create a local sandbox directory: {e}") from e
        self._root = root
        if self._bwrap is None:
            log.info(
                "local sandbox started without isolation (bubblewrap not used)",
                extra={"fields": {"sandbox": self._id, "root": str(root)}},
            )

    def _argv(self, command: str, cwd: str) -> list[str]:
        if self._bwrap is None:
            return ["bash", "-c", command]
        root = str(self.root)
        return [
            self._bwrap,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--bind", root, root,
            "--unshare-pid",
            "--die-with-parent",
            "--chdir", cwd,
            "bash", "-c", command,
        ]  # fmt: skip

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's limit inside the sandbox, not a cancel scope)
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `command` with bash in its own process group; kill the group past `timeout`."""
        root = self.root
        cwd = resolve(self.workdir, cwd) if cwd else self.workdir
        full_env = {**os.environ, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), **(env or {}),
                    MARKER: self._id}  # fmt: skip
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(command, cwd),
                cwd=cwd,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a timeout kills its children too
            )
        except OSError as e:
            raise SandboxCommandError(f"cannot start a command in {self._id}: {e}") from e
        self._procs.add(proc)
        chunks: list[bytes] = []
        reader = asyncio.create_task(_read_capped(proc, chunks))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
            await _kill_group(proc)
        finally:
            if proc.returncode is None:  # cancelled from outside: leave nothing running
                await _kill_group(proc)
            self._procs.discard(proc)
        try:
            # A background child (`cmd &`) may still hold the pipe open after the shell exits.
            await asyncio.wait_for(reader, KILL_GRACE_S)
        except TimeoutError:
            pass
        output = b"".join(chunks).decode(errors="replace")
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            output=output,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def _host_path(self, path: str) -> Path:
        # The file API refuses paths outside the sandbox root: without bubblewrap a command can
        # still touch anything, but the runner itself must never write to the host by accident.
        p = Path(resolve(self.workdir, path)).resolve()
        root = self.root.resolve()
        if p != root and root not in p.parents:
            raise SandboxCommandError(f"path {path!r} is outside sandbox {self._id}")
        return p

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Create or replace a file under the sandbox root."""
        p = self._host_path(path)
        data = content.encode() if isinstance(content, str) else content
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        except OSError as e:
            raise SandboxCommandError(f"cannot write {path!r} in {self._id}: {e}") from e

    async def read_file(self, path: str) -> bytes:
        """The content of a file under the sandbox root."""
        p = self._host_path(path)
        try:
            return p.read_bytes()
        except FileNotFoundError as e:
            raise SandboxFileNotFound(f"{path!r} does not exist in {self._id}") from e
        except OSError as e:
            raise SandboxCommandError(f"cannot read {path!r} in {self._id}: {e}") from e

    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory into the sandbox."""
        await asyncio.to_thread(self._upload_sync, local, remote)

    def _upload_sync(self, local: Path, remote: str) -> None:
        dest = self._host_path(remote)
        try:
            if local.is_dir():
                shutil.copytree(local, dest, symlinks=True, dirs_exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(local, dest)
        except FileNotFoundError as e:
            raise SandboxFileNotFound(f"local path {local} does not exist") from e
        except OSError as e:
            raise SandboxCommandError(f"cannot upload {local} to {self._id}:{remote}: {e}") from e

    async def download(self, remote: str, local: Path) -> None:
        """Copy a sandbox file or directory to the host."""
        await asyncio.to_thread(self._download_sync, remote, local)

    def _download_sync(self, remote: str, local: Path) -> None:
        src = self._host_path(remote)
        if not os.path.lexists(src):
            raise SandboxFileNotFound(f"{remote!r} does not exist in {self._id}")
        try:
            if src.is_dir():
                shutil.copytree(src, local, symlinks=True, dirs_exist_ok=True)
            else:
                local.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, local)
        except OSError as e:
            raise SandboxCommandError(f"cannot download {self._id}:{remote}: {e}") from e

    async def stop(self) -> None:
        """Kill whatever still runs (also daemons that left the process group) and delete the directory."""
        for proc in list(self._procs):
            await _kill_group(proc)
        self._procs.clear()
        await asyncio.to_thread(kill_marked, self._id)
        if self._root is not None and not self._keep:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


async def _read_capped(proc: asyncio.subprocess.Process, chunks: list[bytes]) -> None:
    """Drain the pipe (so the child never blocks on it), keeping at most MAX_OUTPUT_BYTES."""
    if proc.stdout is None:
        return
    kept = 0
    truncated = False
    while block := await proc.stdout.read(65536):
        if kept < MAX_OUTPUT_BYTES:
            chunks.append(block[: MAX_OUTPUT_BYTES - kept])
            kept += len(chunks[-1])
        elif not truncated:
            truncated = True
            chunks.append(b"\n[rlgw: output truncated at 16 MiB]\n")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group, then SIGKILL it after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), wait)
            return
        except TimeoutError:
            continue


def marked_pids(sandbox_id: str) -> list[int]:
    """Processes whose environment carries `RLGW_SANDBOX=<sandbox_id>` (read from /proc).

    A process in the middle of an `exec` reads as an empty environment for a moment (a daemon
    started as `setsid nohup CMD` execs twice): such a process is read again until it is
    through, so that `stop()` does not miss it. One still empty after that cleared its
    environment (`env -i`) and is not ours to find.
    """
    needle = f"{MARKER}={sandbox_id}".encode()
    found: list[int] = []
    pending = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and int(e.name) != os.getpid()]
    for attempt in range(EXEC_REREADS + 1):
        if attempt:
            time.sleep(EXEC_REREAD_S)
        in_exec = []
        for pid in pending:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:  # gone, a zombie or a kernel thread, or not ours to read
                continue
            if not env:
                in_exec.append(pid)
            elif needle in env.split(b"\0"):
                found.append(pid)
        if not in_exec:
            break
        pending = in_exec
    return sorted(found)


def kill_marked(sandbox_id: str) -> list[int]:
    """SIGTERM, then SIGKILL, every process marked with `sandbox_id`; the pids found first."""
    pids = marked_pids(sandbox_id)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_GRACE_S
        while sig == signal.SIGTERM and time.monotonic() < deadline and running(pids):
            time.sleep(0.05)
    return pids


def running(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie is dead, only not yet reaped by whoever inherited it)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            continue
    return alive
