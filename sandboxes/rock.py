"""The ROCK sandbox: a client for ROCK's admin HTTP API (`/apis/envs/sandbox/v1/...`).

It speaks the contract of ROCK's own SDK (`rl-rock`, `rock/sdk/sandbox/client.py`):
`start_async` then `get_status` polling until `is_alive`, `execute`, `read_file`, `write_file`,
multipart `upload`, `stop` (ROCK's persistent bash sessions are not used: every command runs
detached through `execute`, see below);
every answer is the envelope `{status: "Success"|"Failed", message, error, result}`; the
key travels as `XRL-Authorization: Bearer KEY`. Directory transfer goes through `upload`
plus `tar`, downloads through `execute` with `tar | base64` (ROCK's admin API has no
download route).

What ROCK really does, and how this client copes (observed in `rl-rock` 1.11's rocklet and
admin code, `rock/rocklet/server.py` and `rock/sandbox/service/sandbox_proxy_service.py`):
- the in-sandbox server cuts every request at 85 s, and the admin turns that 504 (and any
  rocklet exception, a command timeout included) into a *successful* reply with
  `exit_code: -1` and empty output while the command runs on. So every command runs as a
  detached job (`sandboxes.jobs`), polled by short requests, killed on its own deadline;
- `read_file` of a missing file is a successful reply with empty content (the rocklet's
  error is swallowed). So files are read through `execute` with an explicit existence
  test, byte-exact (`test -f` then `base64`).

This module owns the wire mapping only: no retries beyond status polling, nothing about
agents. Configure it with `RockConfig` (or `RockConfig.from_env()`: `ROCK_BASE_URL`,
`ROCK_API_KEY`, `ROCK_IMAGE`).
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import shlex
import tarfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rlgw.sandboxes import jobs
from rlgw.sandboxes.base import (
    ExecResult,
    SandboxCommandError,
    SandboxError,
    SandboxFileNotFound,
    SandboxStartError,
    resolve,
)

log = logging.getLogger(__name__)

API_PREFIX = "/apis/envs/sandbox/v1"
# Extra seconds the HTTP read may take beyond a command's own limit (queueing, transfer).
HTTP_SLACK_S = 30.0
# Output kept per command (its tail), as the local sandbox keeps.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
# Poll replies in a row that carry no job state (cut or failed requests) before giving up.
MAX_INCONCLUSIVE_POLLS = 3
# Exit code of the existence tests in read_file / download.
_MISSING = 44


@dataclass(frozen=True, slots=True)
class RockConfig:
    """Where the ROCK admin server is and what sandbox to ask it for.

    `workdir` and `scratch` are shell-expanded inside the sandbox at start (so `$HOME/work`
    works); `cluster` goes in the `X-Cluster` header as the SDK sends it.
    """

    base_url: str
    api_key: str | None = None
    image: str = "python:3.11"
    memory: str = "8g"
    cpus: float = 2.0
    cluster: str = "default"
    startup_timeout_s: float = 300.0
    poll_interval_s: float = 1.0
    auto_clear_minutes: int = 360
    workdir: str = "/workspace"
    scratch: str = "/rlgw"
    jobs_dir: str = "/tmp/rlgw-jobs"
    # Longest one poll request waits in the sandbox: must stay below ROCK's request cut (85 s).
    poll_wait_s: float = jobs.POLL_WAIT_S
    extra_headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, **overrides: Any) -> RockConfig:
        """Build from `ROCK_BASE_URL` (required), `ROCK_API_KEY`, `ROCK_IMAGE`, then `overrides`."""
        base = os.environ.get("ROCK_BASE_URL")
        if not base and "base_url" not in overrides:
            raise SandboxError(
                "ROCK_BASE_URL is not set (the ROCK admin server, e.g. http://rock-admin:8080)"
            )
        values: dict[str, Any] = {"base_url": base, "api_key": os.environ.get("ROCK_API_KEY")}
        if os.environ.get("ROCK_IMAGE"):
            values["image"] = os.environ["ROCK_IMAGE"]
        values.update(overrides)
        return cls(**values)


class RockSandbox:
    """One ROCK sandbox driven over HTTP.

    Features: async start with status polling that fails fast on a failed phase; commands
    of any length as detached jobs (no request outlives ROCK's 85 s cut), killed as a whole
    process group past their limit (`ExecResult(timed_out=True)` with the output so far);
    byte-exact reads with an explicit existence test; directories moved via tar.
    Trade-offs: every command costs at least one request plus a job directory under
    `config.jobs_dir`; a command longer than `jobs.POLL_WAIT_S` costs one request per poll.
    """

    def __init__(self, config: RockConfig, *, client: httpx.AsyncClient | None = None):
        self.config = config
        self._client = client
        self._own_client = client is None
        self._sandbox_id: str | None = None
        self._workdir: str | None = None
        self._scratch: str | None = None
        self._finished_jobs: list[jobs.DetachedJob] = []  # read, their directories not yet removed

    @property
    def id(self) -> str:
        return self._sandbox_id or "rock-unstarted"

    @property
    def workdir(self) -> str:
        if self._workdir is None:
            raise SandboxError("sandbox not started")
        return self._workdir

    @property
    def scratch(self) -> str:
        if self._scratch is None:
            raise SandboxError("sandbox not started")
        return self._scratch

    def _headers(self) -> dict[str, str]:
        headers = {"X-Cluster": self.config.cluster, **self.config.extra_headers}
        if self.config.api_key:
            headers["XRL-Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0))
        return self._client

    async def _call(
        self,
        method: str,
        route: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        data: dict[str, str] | None = None,
        files: dict[str, Any] | None = None,
        read_timeout: float | None = None,
    ) -> tuple[bool, Any, str]:
        """One API call: returns (succeeded, result, error text) from ROCK's envelope."""
        url = f"{self.config.base_url.rstrip('/')}{API_PREFIX}/{route}"
        timeout = httpx.Timeout(60.0, connect=10.0, read=read_timeout) if read_timeout else None
        try:
            resp = await self._http().request(
                method,
                url,
                json=json,
                params=params,
                data=data,
                files=files,
                headers=self._headers(),
                **({"timeout": timeout} if timeout else {}),
            )
        except httpx.HTTPError as e:
            raise SandboxCommandError(f"ROCK {route} failed ({type(e).__name__}: {e}) at {url}") from e
        if resp.status_code in (401, 403):
            raise SandboxCommandError(
                f"ROCK refused the key ({resp.status_code}) at {url}: check ROCK_API_KEY"
            )
        if resp.status_code != 200:
            raise SandboxCommandError(
                f"ROCK {route} answered HTTP {resp.status_code} at {url}: {resp.text[:500]}"
            )
        try:
            body = resp.json()
        except ValueError as e:
            raise SandboxCommandError(f"ROCK {route} answered non-JSON at {url}: {resp.text[:200]!r}") from e
        ok = body.get("status") == "Success"
        error = " ".join(str(x) for x in (body.get("message"), body.get("error")) if x)
        return ok, body.get("result"), error

    async def start(self) -> None:
        """`start_async`, then poll `get_status` until alive; create workdir and scratch."""
        ok, result, error = await self._call(
            "POST",
            "start_async",
            json={
                "image": self.config.image,
                "memory": self.config.memory,
                "cpus": self.config.cpus,
                "auto_clear_time_minutes": self.config.auto_clear_minutes,
                "startup_timeout": self.config.startup_timeout_s,
            },
        )
        if not ok or not result or not result.get("sandbox_id"):
            raise SandboxStartError(f"ROCK could not start a sandbox from {self.config.image!r}: {error}")
        self._sandbox_id = result["sandbox_id"]
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            ok, status, error = await self._call("GET", "get_status", params={"sandbox_id": self._sandbox_id})
            if not ok:
                raise SandboxStartError(f"ROCK get_status failed for {self._sandbox_id}: {error}")
            if status.get("is_alive"):
                break
            for phase, detail in (status.get("status") or {}).items():
                if isinstance(detail, dict) and detail.get("status") in ("failed", "timeout"):
                    raise SandboxStartError(
                        f"ROCK sandbox {self._sandbox_id} failed in phase {phase!r}: {detail.get('message')}"
                    )
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"ROCK sandbox {self._sandbox_id} not alive after {self.config.startup_timeout_s:.0f}s"
                )
            await asyncio.sleep(self.config.poll_interval_s)
        probe = await self._execute(
            f"mkdir -p {self.config.workdir} {self.config.scratch} && "
            f"cd {self.config.workdir} && pwd && cd {self.config.scratch} && pwd",
            timeout=60,
            cwd=None,
        )
        lines = probe.output.split()
        if not probe.ok or len(lines) < 2:
            raise SandboxStartError(
                f"cannot prepare workdir in ROCK sandbox {self._sandbox_id}: {probe.output}"
            )
        self._workdir, self._scratch = lines[0], lines[1]
        log.info(
            "rock sandbox started",
            extra={"fields": {"sandbox": self._sandbox_id, "image": self.config.image}},
        )

    async def _request(self, script: str, *, wait_s: float) -> tuple[int | None, str, str]:
        """One `execute` call running `script` (expected back within `wait_s`): (exit, stdout, stderr).

        Directories of jobs already read are removed first. ROCK's `timeout` is set past `wait_s`
        so that ROCK's own subprocess limit never fires first. A `Failed` reply (ROCK's admin
        answers so when it cannot reach the rocklet) comes back as exit None with the error text.
        """
        cleanup, self._finished_jobs = "".join(j.cleanup_script() for j in self._finished_jobs), []
        ok, result, error = await self._call(
            "POST",
            "execute",
            json={
                "sandbox_id": self._sandbox_id,
                "command": ["bash", "-c", cleanup + script],
                "timeout": wait_s + HTTP_SLACK_S,
                "cwd": None,
            },
            read_timeout=wait_s + 2 * HTTP_SLACK_S,
        )
        if not ok:
            return None, "", error
        return result.get("exit_code"), result.get("stdout") or "", result.get("stderr") or ""

    async def _execute(
        self,
        command: str,
        *,
        timeout: float | None,  # noqa: ASYNC109
        cwd: str | None,
        env: Mapping[str, str] | None = None,
        max_output: int | None = MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run `command` as a detached job (see `jobs`), polled until it ends or `timeout` passes."""
        job = jobs.DetachedJob(f"{self.config.jobs_dir}/{uuid.uuid4().hex}", max_output)
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        launch = job.launch_script(command, cwd=cwd, env=env)
        inconclusive = 0
        try:
            while True:
                wait_s = self.config.poll_wait_s
                if deadline is not None:
                    wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
                exit_code, stdout, stderr = await self._request(
                    launch + job.poll_script(wait_s), wait_s=wait_s
                )
                state = jobs.read_state(stderr)
                if state.done:
                    return ExecResult(state.exit_code, stdout, duration_s=time.monotonic() - started)
                if state.missing:
                    raise SandboxCommandError(f"ROCK job {job.dir} did not start in {self._sandbox_id}")
                if state.running:
                    inconclusive, launch = 0, ""  # it runs: later requests only poll
                else:
                    # ROCK's cut or a rocklet error, reported as exit -1 with no output, or a
                    # `Failed` reply: the job (if launched) runs on; the launch is safe to resend.
                    inconclusive += 1
                    if inconclusive > MAX_INCONCLUSIVE_POLLS:
                        raise SandboxCommandError(
                            f"ROCK gave {inconclusive} replies without job state in {self._sandbox_id} "
                            f"(exit {exit_code}): {(stdout + stderr)[-500:]}"
                        )
                if deadline is not None and time.monotonic() >= deadline:
                    partial = await self._kill(job)
                    return ExecResult(None, partial, timed_out=True, duration_s=time.monotonic() - started)
        finally:
            self._finished_jobs.append(job)

    async def _kill(self, job: jobs.DetachedJob) -> str:
        """End a job past its limit; its output so far, read again while the kill's reply is lost."""
        script = job.kill_script(jobs.KILL_GRACE_S)
        for _ in range(MAX_INCONCLUSIVE_POLLS + 1):
            _, stdout, stderr = await self._request(script, wait_s=jobs.KILL_GRACE_S)
            if jobs.read_state(stderr).output:
                return stdout
            script = job.output_script()  # the kill ran or runs on; only the read is missing
        log.warning(
            "rock job output lost after its timeout",
            extra={"fields": {"sandbox": self._sandbox_id, "job": job.dir}},
        )
        return ""

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's limit inside the sandbox, not a cancel scope)
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `command` with bash as a detached job in the sandbox; `cwd` defaults to `workdir`."""
        return await self._execute(
            command, timeout=timeout, cwd=resolve(self.workdir, cwd) if cwd else self.workdir, env=env
        )

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Text goes through `write_file`; bytes through `upload` (exact)."""
        target = resolve(self.workdir, path)
        await self._execute(f"mkdir -p {shlex.quote(os.path.dirname(target))}", timeout=60, cwd=None)
        if isinstance(content, bytes):
            await self._upload_bytes(content, target)
            return
        ok, result, error = await self._call(
            "POST", "write_file", json={"sandbox_id": self._sandbox_id, "path": target, "content": content}
        )
        if not ok or (isinstance(result, dict) and result.get("success") is False):
            detail = error or (result or {}).get("message", "")
            raise SandboxCommandError(f"ROCK write_file {target} failed in {self._sandbox_id}: {detail}")

    async def read_file(self, path: str) -> bytes:
        """The exact bytes of a file; `SandboxFileNotFound` if it does not exist.

        Not ROCK's `read_file`: that answers a missing file with success and empty content.
        """
        target = shlex.quote(resolve(self.workdir, path))
        res = await self._execute(
            f"test -f {target} || exit {_MISSING}; base64 {target} | tr -d '\\n'",
            timeout=600, cwd=None, max_output=None,
        )  # fmt: skip
        if res.exit_code == _MISSING:
            raise SandboxFileNotFound(f"{path!r} does not exist in {self._sandbox_id}")
        if not res.ok:
            raise SandboxCommandError(f"reading {path} failed in {self._sandbox_id}: {res.output[-500:]}")
        return base64.b64decode(res.output)

    async def _upload_bytes(self, data: bytes, target: str) -> None:
        ok, result, error = await self._call(
            "POST",
            "upload",
            data={"sandbox_id": self._sandbox_id, "target_path": target},
            files={"file": (os.path.basename(target) or "file", data, "application/octet-stream")},
        )
        if not ok or (isinstance(result, dict) and result.get("success") is False):
            raise SandboxCommandError(
                f"ROCK upload to {target} failed in {self._sandbox_id}: {error or result}"
            )

    async def upload(self, local: Path, remote: str) -> None:
        """A file goes up as is; a directory as a tar.gz unpacked in place."""
        target = resolve(self.workdir, remote)
        is_file, data = await asyncio.to_thread(_pack, local)
        if is_file:
            await self.write_file(target, data)
            return
        tmp = f"{self.scratch}/upload-{uuid.uuid4().hex}.tar.gz"
        await self._upload_bytes(data, tmp)
        res = await self._execute(
            f"mkdir -p {shlex.quote(target)} && tar xzf {tmp} -C {shlex.quote(target)} && rm -f {tmp}",
            timeout=600,
            cwd=None,
        )
        if not res.ok:
            raise SandboxCommandError(
                f"unpacking upload into {target} failed in {self._sandbox_id}: {res.output}"
            )

    async def download(self, remote: str, local: Path) -> None:
        """Pack `remote` with tar, move it base64-encoded through `execute`, unpack locally."""
        target = resolve(self.workdir, remote)
        parent, name = os.path.dirname(target) or "/", os.path.basename(target)
        res = await self._execute(
            f"test -e {shlex.quote(target)} || exit {_MISSING}; "
            f"tar czf - -C {shlex.quote(parent)} {shlex.quote(name)} | base64 | tr -d '\\n'",
            timeout=600,
            cwd=None,
            max_output=None,
        )
        if res.exit_code == _MISSING:
            raise SandboxFileNotFound(f"{target!r} does not exist in {self._sandbox_id}")
        if not res.ok:
            raise SandboxCommandError(f"packing {target} failed in {self._sandbox_id}: {res.output[-500:]}")
        if not await asyncio.to_thread(_unpack, base64.b64decode(res.output), name, local):
            raise SandboxCommandError(f"{target!r} in {self._sandbox_id} is not a regular file or directory")

    async def stop(self) -> None:
        """`stop` the sandbox (best effort: a failure is logged, never raised) and close the client."""
        try:
            if self._sandbox_id is not None:
                ok, _, error = await self._call("POST", "stop", json={"sandbox_id": self._sandbox_id})
                if not ok:
                    log.warning(
                        "rock stop failed", extra={"fields": {"sandbox": self._sandbox_id, "error": error}}
                    )
        except SandboxError as e:
            log.warning("rock stop failed", extra={"fields": {"sandbox": self._sandbox_id, "error": str(e)}})
        finally:
            self._sandbox_id = None
            if self._own_client and self._client is not None:
                await self._client.aclose()
                self._client = None


def _pack(local: Path) -> tuple[bool, bytes]:
    """(True, bytes) for a file; (False, tar.gz of its content) for a directory."""
    if not local.exists():
        raise SandboxFileNotFound(f"local path {local} does not exist")
    if local.is_file():
        return True, local.read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(local, arcname=".")
    return False, buf.getvalue()


def _unpack(data: bytes, name: str, local: Path) -> bool:
    """Unpack a tar.gz holding `name` (a file or directory) as `local`; False if it holds neither."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        if any(m.name == name and m.isdir() for m in members):
            local.mkdir(parents=True, exist_ok=True)
            for m in members:
                m.name = os.path.relpath(m.name, name)
            tar.extractall(local, members=members, filter="data")
            return True
        src = tar.extractfile(members[0]) if members else None
        if src is None:
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(src.read())
        return True
