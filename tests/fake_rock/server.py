"""A fake ROCK admin server: ROCK's sandbox HTTP contract, with ROCK's real failure shapes.

It implements the routes ROCK's SDK (`rl-rock`, `rock/sdk/sandbox/client.py`) calls under
`/apis/envs/sandbox/v1`, with ROCK's envelope `{status, message, error, result}`. Behind
each route sits a "rocklet" (ROCK's in-sandbox server) and the admin's translation of its
replies, as `rl-rock` 1.11 does them (`rock/rocklet/server.py`, `rock/rocklet/rocklet.py`,
`rock/sandbox/service/sandbox_proxy_service.py::_send_request`):

- the rocklet cuts every request after `--request-cut` seconds (ROCK: 85) with a 504, while
  the work goes on; any rocklet exception is a 511 (a command past its `timeout`, a missing
  file, an unknown session);
- the admin turns both into `{"exit_code": -1, "failure_reason": ...}` and builds the
  route's response model from it, so: `execute` answers *success* with exit code -1 and
  empty output (the failure reason is dropped), `read_file` *success* with empty content,
  `write_file` / `upload` success with `success: false`; only `run_in_session` answers
  `Failed` for exit code -1;
- `execute` runs the argv with `subprocess.run` as the rocklet does (`shell` false by
  default, `env` replaces the environment, on timeout only the direct child is killed).

With `--rocklet-url` the rocklet is a real one (`rock.rocklet.server`, started elsewhere) and
this server is only the admin: start/status plus the forwarding and translation above (and,
as ROCK's admin, a `Failed` reply when the rocklet cannot be reached).

A "sandbox" is a directory under `--root` used as HOME and default cwd; nothing is
isolated. An image whose name starts with `fail:` fails its `docker_run` phase.

Run: `python -m tests.fake_rock.server --port 8080 --root /tmp/rock [--api-key KEY]
[--request-cut 85] [--rocklet-url http://127.0.0.1:8000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import uvicorn
from fastapi import Body, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel

PREFIX = "/apis/envs/sandbox/v1"
DONE = "__FAKE_ROCK_DONE__"
ROCK_REQUEST_CUT_S = 85.0

# The fields (with defaults) of ROCK's response models: the admin builds them from whatever
# the rocklet answered, so a translated failure leaves exactly these defaults.
EXECUTE_FIELDS = {"stdout": "", "stderr": "", "exit_code": None}
READ_FIELDS = {"content": ""}
WRITE_FIELDS = {"success": False, "message": ""}
UPLOAD_FIELDS = {"success": False, "message": "", "file_name": ""}
OBSERVATION_FIELDS = {"session_type": "bash", "output": "", "exit_code": None, "failure_reason": "",
                      "expect_string": ""}  # fmt: skip
CREATE_SESSION_FIELDS = {"output": "", "session_type": "bash"}
CLOSE_SESSION_FIELDS = {"session_type": "bash"}


def ok(result: Any) -> dict[str, Any]:
    return {"status": "Success", "message": None, "error": None, "result": result}


def failed(message: str | None, error: str) -> dict[str, Any]:
    return {"status": "Failed", "message": message, "error": error, "result": None}


def shape(raw: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A response model built from `raw` as pydantic does (unknown keys ignored, defaults filled)."""
    return {k: raw.get(k, default) for k, default in fields.items()}


class RockletError(Exception):
    """An exception inside the rocklet (ROCK answers it with HTTP 511)."""


class RockletUnreachable(Exception):
    """The admin's request to the rocklet failed at the transport (ROCK: "Service unavailable")."""


class BashSession:
    """A persistent bash process; each command's end is found by a marker line."""

    def __init__(self, home: Path, env: dict[str, str] | None):
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=home,
            env={**os.environ, "HOME": str(home), **(env or {})},
            text=True,
            start_new_session=True,
        )
        self.lock = threading.Lock()

    def run(self, command: str, timeout: float | None, check: str) -> dict[str, Any]:
        with self.lock:
            assert self.proc.stdin and self.proc.stdout
            self.proc.stdin.write(f"{command}\necho {DONE}$?\n")
            self.proc.stdin.flush()
            lines: list[str] = []
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise RockletError(f"timeout after {timeout} seconds while running command {command!r}")
                line = self.proc.stdout.readline()
                if not line:
                    code, output = -1, "".join(lines)
                    break
                if line.startswith(DONE):
                    code, output = int(line[len(DONE) :].strip()), "".join(lines).rstrip("\n")
                    break
                lines.append(line)
        if check == "raise" and code != 0:
            raise RockletError(f"Command {command!r} failed with exit code {code}")
        return {"output": output, "exit_code": code}

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class FakeSandbox:
    def __init__(self, sid: str, home: Path, image: str, ready_at: float):
        self.sid, self.home, self.image, self.ready_at = sid, home, image, ready_at
        self.sessions: dict[str, BashSession] = {}


class StartRequest(BaseModel):
    image: str
    memory: str = "8g"
    cpus: float = 2
    sandbox_id: str | None = None
    model_config = {"extra": "allow"}


class CommandRequest(BaseModel):
    sandbox_id: str
    command: str | list[str]
    timeout: float | None = 1200
    cwd: str | None = None
    env: dict[str, str] | None = None
    shell: bool = False
    model_config = {"extra": "allow"}


class CreateSessionRequest(BaseModel):
    sandbox_id: str
    session_type: str = "bash"
    session: str = "default"
    env_enable: bool = False
    env: dict[str, str] | None = None
    model_config = {"extra": "allow"}


class RunInSessionRequest(BaseModel):
    sandbox_id: str
    action_type: str = "bash"
    session: str = "default"
    command: str
    timeout: float | None = None
    check: str = "raise"
    model_config = {"extra": "allow"}


class CloseSessionRequest(BaseModel):
    sandbox_id: str
    session_type: str = "bash"
    session: str = "default"


class ReadFileRequest(BaseModel):
    sandbox_id: str
    path: str
    encoding: str | None = None
    errors: str | None = None


class WriteFileRequest(BaseModel):
    sandbox_id: str
    path: str
    content: str


def run_command(req: CommandRequest, cwd: Path) -> dict[str, Any]:
    """The rocklet's `execute`: `subprocess.run` with its arguments; a timeout is an exception."""
    try:
        # The sandbox's own environment has HOME at its directory (a container's would be its home).
        env = req.env if req.env is not None else {**os.environ, "HOME": str(cwd)}
        proc = subprocess.run(req.command, shell=req.shell, timeout=req.timeout, env=env,
                              capture_output=True, cwd=req.cwd or cwd)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise RockletError(f"Timeout ({req.timeout}s) exceeded while running command") from None
    out, err = (x.decode(errors="backslashreplace") for x in (proc.stdout, proc.stderr))
    return {"stdout": out, "stderr": err, "exit_code": proc.returncode}


class LocalRocklet:
    """The rocklet's work done in this process, under ROCK's request cut and error translation."""

    def __init__(self, cut_s: float):
        self.cut_s = cut_s

    async def call(self, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """Run `fn` in a thread; the admin's view of the rocklet's reply (cut and errors translated).

        A cut request's thread is not stopped, as ROCK's executor thread is not: the work goes on.
        """
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), self.cut_s)
        except TimeoutError:
            reason = f"Request processing timed out after {self.cut_s:g} seconds."
            return {"exit_code": -1, "failure_reason": reason}
        except Exception as e:  # every rocklet exception is a 511
            return {"exit_code": -1, "failure_reason": str(e)}


class RemoteRocklet:
    """A real rocklet over HTTP, with the admin's `_send_request` translation of 511 and 504."""

    def __init__(self, url: str):
        self.client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=httpx.Timeout(None, connect=10.0))

    async def post(self, path: str, *, json: dict[str, Any] | None = None, data: dict[str, str] | None = None,
                   files: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        try:
            resp = await self.client.post(f"/{path}", json=json, data=data, files=files)
        except httpx.RequestError as e:
            # The real rocklet resets a kept-alive connection after answering 511, so the admin's
            # next request on it fails here; ROCK's admin then answers `Failed`, as below.
            raise RockletUnreachable("Service unavailable: Upstream server is not reachable.") from e
        if resp.status_code == 511:
            return {"exit_code": -1, "failure_reason": resp.json()["rockletexception"]["message"]}
        if resp.status_code == 504:
            return {"exit_code": -1, "failure_reason": resp.json()["detail"]}
        return resp.json()


def create_app(
    root: Path,
    api_key: str | None = None,
    startup_delay: float = 0.0,
    request_cut_s: float = ROCK_REQUEST_CUT_S,
    rocklet_url: str | None = None,
) -> FastAPI:
    """The fake admin app; sandboxes live in directories under `root`."""
    app = FastAPI()
    boxes: dict[str, FakeSandbox] = {}
    local = LocalRocklet(request_cut_s)
    remote = RemoteRocklet(rocklet_url) if rocklet_url else None

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if api_key and request.url.path.startswith(PREFIX):
            if request.headers.get("XRL-Authorization") != f"Bearer {api_key}":
                return JSONResponse({"detail": "invalid XRL-Authorization"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(RockletUnreachable)
    async def unreachable(request: Request, exc: RockletUnreachable) -> JSONResponse:
        return JSONResponse(failed("rock admin request failed", str(exc)))

    def box(sid: str) -> FakeSandbox:
        if sid not in boxes:
            raise KeyError(f"sandbox {sid} not found")
        return boxes[sid]

    async def rocklet(
        path: str, body: BaseModel, fn: Callable[..., dict[str, Any]], *args: Any
    ) -> dict[str, Any]:
        if remote is not None:
            return await remote.post(path, json=body.model_dump())
        return await local.call(fn, *args)

    @app.get("/")
    async def root_route() -> dict[str, str]:
        return {"message": "hello, ROCK!"}

    @app.post(f"{PREFIX}/start_async")
    async def start_async(req: StartRequest) -> dict[str, Any]:
        sid = req.sandbox_id or uuid.uuid4().hex
        home = root / sid
        home.mkdir(parents=True, exist_ok=True)
        boxes[sid] = FakeSandbox(sid, home, req.image, time.monotonic() + startup_delay)
        return ok({"sandbox_id": sid, "host_name": "fake-rock", "host_ip": "127.0.0.1", "cpus": req.cpus,
                   "memory": req.memory})  # fmt: skip

    @app.get(f"{PREFIX}/get_status")
    async def get_status(sandbox_id: str, include_all_states: bool = False) -> dict[str, Any]:
        try:
            b = box(sandbox_id)
        except KeyError as e:
            return failed("get sandbox status failed", str(e))
        ready = time.monotonic() >= b.ready_at
        if b.image.startswith("fail:"):
            phases = {
                "image_pull": {"status": "success", "message": "image pulled"},
                "docker_run": {"status": "failed", "message": f"cannot run image {b.image}"},
            }
            alive = False
        else:
            run_state = "success" if ready else "running"
            phases = {
                "image_pull": {"status": "success", "message": "image pulled"},
                "docker_run": {"status": run_state, "message": "docker run"},
            }
            alive = ready
        state = "running" if alive else "pending"
        return ok({"sandbox_id": sandbox_id, "status": phases, "is_alive": alive, "host_name": "fake-rock",
                   "host_ip": "127.0.0.1", "image": b.image, "state": state})  # fmt: skip

    @app.get(f"{PREFIX}/is_alive")
    async def is_alive(sandbox_id: str) -> dict[str, Any]:
        alive = sandbox_id in boxes and time.monotonic() >= boxes[sandbox_id].ready_at
        return ok({"is_alive": alive, "message": "fake-rock"})

    @app.post(f"{PREFIX}/execute")
    async def execute(req: CommandRequest) -> dict[str, Any]:
        try:
            home = box(req.sandbox_id).home
        except KeyError as e:
            return failed("execute command failed", str(e))
        return ok(shape(await rocklet("execute", req, run_command, req, home), EXECUTE_FIELDS))

    @app.post(f"{PREFIX}/create_session")
    async def create_session(req: CreateSessionRequest) -> dict[str, Any]:
        try:
            b = box(req.sandbox_id)
        except KeyError as e:
            return failed("create session failed", str(e))

        def create() -> dict[str, Any]:
            if req.session in b.sessions:
                raise RockletError(f"session {req.session} already exists")
            b.sessions[req.session] = BashSession(b.home, req.env if req.env_enable else None)
            return {"output": "", "session_type": "bash"}

        return ok(shape(await rocklet("create_session", req, create), CREATE_SESSION_FIELDS))

    @app.post(f"{PREFIX}/run_in_session")
    async def run_in_session(req: RunInSessionRequest) -> dict[str, Any]:
        try:
            b = box(req.sandbox_id)
        except KeyError as e:
            return failed("run in session failed", str(e))

        def run() -> dict[str, Any]:
            if req.session not in b.sessions:
                raise RockletError(f"session {req.session!r} does not exist")
            return b.sessions[req.session].run(req.command, req.timeout, req.check)

        obs = shape(await rocklet("run_in_session", req, run), OBSERVATION_FIELDS)
        if obs["exit_code"] == -1:  # the one route where the admin reports exit -1 as a failure
            return failed(None, obs["failure_reason"])
        return ok(obs)

    @app.post(f"{PREFIX}/close_session")
    async def close_session(req: CloseSessionRequest) -> dict[str, Any]:
        try:
            b = box(req.sandbox_id)
        except KeyError as e:
            return failed("close session failed", str(e))

        def close() -> dict[str, Any]:
            if req.session not in b.sessions:
                raise RockletError(f"session {req.session!r} does not exist")
            b.sessions.pop(req.session).close()
            return {"session_type": "bash"}

        return ok(shape(await rocklet("close_session", req, close), CLOSE_SESSION_FIELDS))

    @app.post(f"{PREFIX}/read_file")
    async def read_file(req: ReadFileRequest) -> dict[str, Any]:
        try:
            box(req.sandbox_id)
        except KeyError as e:
            return failed("read file failed", str(e))

        def read() -> dict[str, Any]:
            return {"content": Path(req.path).read_text(encoding=req.encoding, errors=req.errors)}

        return ok(shape(await rocklet("read_file", req, read), READ_FIELDS))

    @app.post(f"{PREFIX}/write_file")
    async def write_file(req: WriteFileRequest) -> dict[str, Any]:
        try:
            box(req.sandbox_id)
        except KeyError as e:
            return failed("write file failed", str(e))

        def write() -> dict[str, Any]:
            p = Path(req.path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(req.content)
            return {"success": True}

        return ok(shape(await rocklet("write_file", req, write), WRITE_FIELDS))

    @app.post(f"{PREFIX}/upload")
    async def upload(
        file: UploadFile = File(...),  # noqa: B008 (FastAPI's idiom, as ROCK's own route)
        target_path: str = Form(...),
        sandbox_id: str = Form(...),
    ) -> dict[str, Any]:
        try:
            box(sandbox_id)
        except KeyError as e:
            return failed("upload file failed", str(e))
        data = await file.read()
        if remote is not None:
            raw = await remote.post("upload", data={"target_path": target_path, "unzip": "false"},
                                    files={"file": (file.filename, data, file.content_type)})  # fmt: skip
            return ok(shape(raw, UPLOAD_FIELDS))

        def save() -> dict[str, Any]:
            p = Path(target_path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            return {"success": True, "file_name": p.name}

        return ok(shape(await local.call(save), UPLOAD_FIELDS))

    @app.post(f"{PREFIX}/stop")
    async def stop(sandbox_id: Annotated[str, Body(embed=True)]) -> dict[str, Any]:
        b = boxes.pop(sandbox_id, None)
        if b is not None:
            for s in b.sessions.values():
                s.close()
            shutil.rmtree(b.home, ignore_errors=True)
        return ok(f"{sandbox_id} stopped")

    app.state.boxes = boxes
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake ROCK admin server for tests.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--request-cut", type=float, default=ROCK_REQUEST_CUT_S,
                        help="seconds after which the rocklet cuts a request (ROCK: 85)")  # fmt: skip
    parser.add_argument("--rocklet-url", default=None, help="forward to a real rocklet (rock.rocklet.server)")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    app = create_app(args.root, args.api_key, args.startup_delay, args.request_cut, args.rocklet_url)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
