"""A fake ROCK admin server: ROCK's sandbox HTTP contract over local subprocesses.

It implements the routes ROCK's SDK (`rl-rock`, `rock/sdk/sandbox/client.py`) calls under
`/apis/envs/sandbox/v1`, with ROCK's envelope `{status, message, error, result}` (failures
are HTTP 200 with `status: "Failed"`, as ROCK's `handle_exceptions` answers) and ROCK's
execution semantics: `execute` runs the argv with `subprocess` (`shell` false by default;
`env`, when given, replaces the environment; a command past `timeout` fails with
"Timeout (Ns) exceeded while running command"). A "sandbox" is a directory under `--root`
used as HOME and default cwd; nothing is isolated. An image whose name starts with
`fail:` fails its `docker_run` phase, to exercise start failures.

Run: `python -m tests.fake_rock.server --port 8080 --root /tmp/rock [--api-key KEY]`.
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
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Body, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel

PREFIX = "/apis/envs/sandbox/v1"
DONE = "__FAKE_ROCK_DONE__"


def ok(result: Any) -> dict[str, Any]:
    return {"status": "Success", "message": None, "error": None, "result": result}


def failed(message: str, error: str) -> dict[str, Any]:
    return {"status": "Failed", "message": message, "error": error, "result": None}


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

    def run(self, command: str, timeout: float | None) -> tuple[str, int]:
        with self.lock:
            assert self.proc.stdin and self.proc.stdout
            self.proc.stdin.write(f"{command}\necho {DONE}$?\n")
            self.proc.stdin.flush()
            lines: list[str] = []
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"Timeout ({timeout}s) exceeded while running command")
                line = self.proc.stdout.readline()
                if not line:
                    return "".join(lines), -1
                if line.startswith(DONE):
                    return "".join(lines).rstrip("\n"), int(line[len(DONE) :].strip())
                lines.append(line)

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
    """subprocess semantics as ROCK's rocklet uses them, with the whole group killed on timeout."""
    proc = subprocess.Popen(
        req.command,
        shell=req.shell,
        env=req.env,
        cwd=req.cwd or cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=req.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"Timeout ({req.timeout}s) exceeded while running command") from None
    return {
        "stdout": out.decode(errors="backslashreplace"),
        "stderr": err.decode(errors="backslashreplace"),
        "exit_code": proc.returncode,
    }


def create_app(root: Path, api_key: str | None = None, startup_delay: float = 0.0) -> FastAPI:
    """The fake admin app; sandboxes live in directories under `root`."""
    app = FastAPI()
    boxes: dict[str, FakeSandbox] = {}

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if api_key and request.url.path.startswith(PREFIX):
            if request.headers.get("XRL-Authorization") != f"Bearer {api_key}":
                return JSONResponse({"detail": "invalid XRL-Authorization"}, status_code=401)
        return await call_next(request)

    def box(sid: str) -> FakeSandbox:
        if sid not in boxes:
            raise KeyError(f"sandbox {sid} not found")
        return boxes[sid]

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
            return ok(await asyncio.to_thread(run_command, req, box(req.sandbox_id).home))
        except Exception as e:  # ROCK answers every failure in the envelope
            return failed("execute command failed", str(e))

    @app.post(f"{PREFIX}/create_session")
    async def create_session(req: CreateSessionRequest) -> dict[str, Any]:
        try:
            b = box(req.sandbox_id)
            if req.session in b.sessions:
                raise ValueError(f"session {req.session} already exists")
            b.sessions[req.session] = BashSession(b.home, req.env if req.env_enable else None)
            return ok({"output": "", "session_type": "bash"})
        except Exception as e:
            return failed("create session failed", str(e))

    @app.post(f"{PREFIX}/run_in_session")
    async def run_in_session(req: RunInSessionRequest) -> dict[str, Any]:
        try:
            b = box(req.sandbox_id)
            if req.session not in b.sessions:
                raise ValueError(f"session {req.session} does not exist")
            output, code = await asyncio.to_thread(b.sessions[req.session].run, req.command, req.timeout)
        except Exception as e:
            return failed("run in session failed", str(e))
        if req.check == "raise" and code != 0:
            return failed("run in session failed", f"Command {req.command!r} failed with exit code {code}")
        return ok({"session_type": "bash", "output": output, "exit_code": code, "failure_reason": "",
                   "expect_string": ""})  # fmt: skip

    @app.post(f"{PREFIX}/close_session")
    async def close_session(req: CloseSessionRequest) -> dict[str, Any]:
        try:
            box(req.sandbox_id).sessions.pop(req.session).close()
            return ok({"session_type": "bash"})
        except Exception as e:
            return failed("close session failed", str(e))

    @app.post(f"{PREFIX}/read_file")
    async def read_file(req: ReadFileRequest) -> dict[str, Any]:
        try:
            box(req.sandbox_id)
            return ok({"content": Path(req.path).read_text(encoding=req.encoding, errors=req.errors)})  # noqa: ASYNC240 (small local files)
        except Exception as e:
            return failed("read file failed", str(e))

    @app.post(f"{PREFIX}/write_file")
    async def write_file(req: WriteFileRequest) -> dict[str, Any]:
        try:
            box(req.sandbox_id)
            p = Path(req.path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(req.content)  # noqa: ASYNC240 (small local files)
            return ok({"success": True, "message": f"wrote {req.path}"})
        except Exception as e:
            return failed("write file failed", str(e))

    @app.post(f"{PREFIX}/upload")
    async def upload(
        file: UploadFile = File(...),  # noqa: B008 (FastAPI's idiom, as ROCK's own route)
        target_path: str = Form(...),
        sandbox_id: str = Form(...),
    ) -> dict[str, Any]:
        try:
            box(sandbox_id)
            p = Path(target_path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(await file.read())  # noqa: ASYNC240 (small local files)
            return ok({"success": True, "message": "", "file_name": p.name})
        except Exception as e:
            return failed("upload file failed", str(e))

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
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    app = create_app(args.root, args.api_key, args.startup_delay)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
