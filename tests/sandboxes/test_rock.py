"""The ROCK client against the fake ROCK server, the fake against ROCK's own SDK, and the client
against ROCK's real rocklet (`rock.rocklet.server`) behind the fake admin.

The fake cuts requests after CUT_S seconds (ROCK: 85 s), so everything ROCK does at 85 s
happens here in 2 s: the client must never lose a command to the cut.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest

from rlgw.sandboxes import jobs
from rlgw.sandboxes.base import Sandbox, SandboxCommandError, SandboxFileNotFound, SandboxStartError
from rlgw.sandboxes.rock import RockConfig, RockSandbox
from tests.fake_rock import fake_rock, real_rocklet
from tests.fake_rock.server import PREFIX

KEY = "rock-test-key"
CUT_S = 2.0


@pytest.fixture(scope="module")
def rock_url(tmp_path_factory: pytest.TempPathFactory):
    with fake_rock(tmp_path_factory.mktemp("rock"), api_key=KEY, startup_delay=0.3, request_cut=CUT_S) as url:
        yield url


def config(url: str, **kw) -> RockConfig:
    kw.setdefault("workdir", "$HOME/workspace")
    kw.setdefault("scratch", "$HOME/rlgw")
    # A jobs directory whose parent does not exist yet, as in a fresh sandbox.
    kw.setdefault("jobs_dir", f"/tmp/rlgw-test-jobs/{uuid.uuid4().hex}/jobs")
    return RockConfig(base_url=url, api_key=KEY, poll_interval_s=0.1, poll_wait_s=0.5, **kw)


async def raw(url: str, route: str, body: dict) -> dict:
    async with httpx.AsyncClient(headers={"XRL-Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        resp = await c.post(f"{url}{PREFIX}/{route}", json=body)
        assert resp.status_code == 200
        return resp.json()


async def test_fake_server_reproduces_rocks_failure_shapes(rock_url: str) -> None:
    sb = RockSandbox(config(rock_url))
    await sb.start()
    try:
        sid, marker = sb.id, f"{sb.scratch}/still-running"
        # A request past the cut: a *success* with exit -1 and no output, while the command runs on.
        t0 = time.monotonic()
        argv = ["bash", "-c", f"echo out; sleep 3; touch {marker}"]
        cut = await raw(rock_url, "execute", {"sandbox_id": sid, "timeout": 60, "command": argv})
        assert CUT_S <= time.monotonic() - t0 < CUT_S + 1.5
        assert cut["status"] == "Success" and cut["result"] == {"stdout": "", "stderr": "", "exit_code": -1}
        await asyncio.sleep(2.0)
        assert (await raw(rock_url, "execute", {"sandbox_id": sid, "command": ["test", "-e", marker]}))[
            "result"
        ]["exit_code"] == 0, "ROCK's cut does not stop the command"
        # A command past its own timeout: the same shape; the reason is dropped.
        timed = await raw(rock_url, "execute", {"sandbox_id": sid, "timeout": 0.5, "command": ["sleep", "5"]})
        assert timed["status"] == "Success" and timed["result"]["exit_code"] == -1
        # A missing file reads as success with empty content.
        missing = await raw(rock_url, "read_file", {"sandbox_id": sid, "path": f"{sb.scratch}/nope.json"})
        assert missing["status"] == "Success" and missing["result"] == {"content": ""}
        # run_in_session is the one route that reports exit -1 as a failure.
        await raw(rock_url, "create_session", {"sandbox_id": sid, "session_type": "bash", "session": "s"})
        long = await raw(rock_url, "run_in_session", {"sandbox_id": sid, "session": "s", "command": "sleep 4",
                                                      "check": "silent"})  # fmt: skip
        assert long["status"] == "Failed" and "timed out after 2 seconds" in long["error"]
    finally:
        await sb.stop()


async def test_commands_outlive_the_request_cut(rock_url: str) -> None:
    sb = RockSandbox(config(rock_url))
    await sb.start()
    try:
        res = await sb.exec("echo begin; sleep 3.5; echo end >&2; exit 3", timeout=30)
        assert res.exit_code == 3 and not res.timed_out and res.duration_s >= 3.5
        assert res.output == "begin\nend\n"
        assert (await sb.exec("mkdir sub")).ok
        ok = await sb.exec("sleep 2.5 && pwd", cwd="sub", timeout=None)
        assert ok.ok and ok.output.strip() == f"{sb.workdir}/sub"
    finally:
        await sb.stop()


async def test_timeout_is_reported_and_kills_the_process_group(rock_url: str) -> None:
    sb = RockSandbox(config(rock_url))
    await sb.start()
    try:
        marker = f"{sb.workdir}/survived"
        t0 = time.monotonic()
        res = await sb.exec(f"(sleep 4; touch {marker}) & echo started; sleep 60", timeout=1.5)
        assert res.timed_out and res.exit_code is None and not res.ok
        assert "started" in res.output  # the output so far comes back with the timeout
        assert time.monotonic() - t0 < 1.5 + CUT_S + 5
        await asyncio.sleep(4.5)
        assert (await sb.exec(f"test -e {marker}")).exit_code == 1, "a child of the timed-out command ran on"
    finally:
        await sb.stop()


async def test_output_of_a_timed_out_command_survives_a_cut_kill(
    rock_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A command that ignores TERM keeps the kill waiting its whole grace; a grace past the cut
    # loses the kill's reply (as lingering zombies did in CI with the real rocklet): the output
    # is read again, and the KILL still lands (the cut request's work goes on).
    monkeypatch.setattr(jobs, "KILL_GRACE_S", CUT_S + 1.0)
    sb = RockSandbox(config(rock_url))
    await sb.start()
    try:
        res = await sb.exec("trap '' TERM; echo started; sleep 59.7", timeout=1.0)
        assert res.timed_out and res.output == "started\n"
        assert res.duration_s >= 1.0 + CUT_S
        await asyncio.sleep(1.5)
        alive = await sb.exec("pgrep -f 'sleep 59[.]7' || true")
        assert alive.ok and alive.output == ""
    finally:
        await sb.stop()


async def test_missing_file_is_not_read_as_empty(rock_url: str) -> None:
    sb = RockSandbox(config(rock_url))
    await sb.start()
    try:
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file(f"{sb.scratch}/reward/reward.json")
        await sb.write_file("empty.txt", "")
        assert await sb.read_file("empty.txt") == b""
        with pytest.raises(SandboxFileNotFound):  # a directory is not a file
            await sb.read_file(sb.workdir)
    finally:
        await sb.stop()


async def test_client_full_contract(rock_url: str, tmp_path: Path) -> None:
    sb = RockSandbox(config(rock_url))
    await sb.start()  # polls get_status through the 0.3 s startup delay
    try:
        assert isinstance(sb, Sandbox)
        assert sb.workdir.endswith("/workspace") and sb.scratch.endswith("/rlgw")
        res = await sb.exec('echo "$A" in $(pwd); echo err >&2; exit 7', env={"A": "it's quoted"})
        assert res.exit_code == 7 and "it's quoted in " + sb.workdir in res.output and "err" in res.output
        timed = await sb.exec("sleep 20", timeout=0.5)
        assert timed.timed_out and timed.exit_code is None

        await sb.write_file("notes/a.txt", "text é")
        assert (await sb.read_file("notes/a.txt")).decode() == "text é"
        await sb.write_file("blob.bin", bytes(range(256)))
        assert (await sb.exec("od -An -tu1 blob.bin | wc -w")).output.strip() == "256"
        assert await sb.read_file("blob.bin") == bytes(range(256))
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file("nope.txt")

        src = tmp_path / "src"
        (src / "d").mkdir(parents=True)
        (src / "d" / "f.bin").write_bytes(b"\x00\xff" * 1000)
        await sb.upload(src, "up")
        down = tmp_path / "down"
        await sb.download("up", down)
        assert (down / "d" / "f.bin").read_bytes() == b"\x00\xff" * 1000
        single = tmp_path / "single.txt"
        await sb.download("notes/a.txt", single)
        assert single.read_text() == "text é"
        with pytest.raises(SandboxFileNotFound):
            await sb.download("absent", tmp_path / "x")

    finally:
        await sb.stop()
    await sb.stop()  # idempotent


async def test_client_start_failures(rock_url: str) -> None:
    with pytest.raises(SandboxStartError, match="docker_run"):
        await RockSandbox(config(rock_url, image="fail:broken")).start()
    bad = RockSandbox(RockConfig(base_url=rock_url, api_key="wrong"))
    with pytest.raises(SandboxCommandError, match="refused the key"):
        await bad.start()
    await bad.stop()


async def test_fake_server_speaks_the_rl_rock_sdk_contract(rock_url: str, tmp_path: Path) -> None:
    pytest.importorskip("rock")
    from rock.actions import Command, CreateBashSessionRequest, ReadFileRequest, UploadMode
    from rock.sdk.sandbox.client import Sandbox as RockSdkSandbox
    from rock.sdk.sandbox.config import SandboxConfig

    sdk = RockSdkSandbox(
        SandboxConfig(base_url=rock_url, extra_headers={"XRL-Authorization": f"Bearer {KEY}"})
    )
    await sdk.start()
    try:
        assert sdk.sandbox_id
        status = await sdk.get_status()
        assert status.is_alive and status.status["docker_run"]["status"] == "success"
        out = await sdk.execute(Command(command=["bash", "-c", "echo sdk; exit 2"]))
        assert out.stdout == "sdk\n" and out.exit_code == 2
        await sdk.create_session(CreateBashSessionRequest(session="main"))
        obs = await sdk.arun("export Y=5; echo $((Y * 2))", session="main")
        assert obs.output.strip() == "10" and obs.exit_code == 0
        home = (await sdk.execute(Command(command=["bash", "-c", "echo -n $HOME"]))).stdout
        wrote = await sdk.write_file_by_path("from sdk", f"{home}/w.txt")
        assert wrote.success
        assert (await sdk.read_file(ReadFileRequest(path=f"{home}/w.txt"))).content == "from sdk"
        local = tmp_path / "u.txt"
        local.write_text("uploaded")
        up = await sdk.upload_by_path(local, f"{home}/u.txt", upload_mode=UploadMode.DIRECT)
        assert up.success, up.message
        assert (await sdk.read_file(ReadFileRequest(path=f"{home}/u.txt"))).content == "uploaded"
    finally:
        await asyncio.wait_for(sdk.stop(), 30)


@pytest.mark.slow
async def test_client_against_rocks_real_rocklet(tmp_path: Path) -> None:
    """RockSandbox -> fake admin (forwarding, ROCK's translation) -> ROCK's own rocklet, cut at 2 s."""
    work = tmp_path / "rocklet"
    work.mkdir()
    with (
        real_rocklet(work, request_cut=CUT_S) as rocklet,
        fake_rock(tmp_path / "admin", api_key=KEY, rocklet_url=rocklet) as url,
    ):
        # The real rocklet's 504 and 511, as the admin passes them on.
        sb = RockSandbox(config(url, workdir=str(work / "ws"), scratch=str(work / "scratch")))
        await sb.start()
        try:
            cut = await raw(url, "execute", {"sandbox_id": sb.id, "command": ["sleep", "4"]})
            assert cut["status"] == "Success" and cut["result"]["exit_code"] == -1
            missing = await raw(url, "read_file", {"sandbox_id": sb.id, "path": str(work / "nope")})
            assert missing["status"] == "Success" and missing["result"]["content"] == ""
            # The client's command path over the real rocklet.
            res = await sb.exec("echo a; sleep 3; echo b; exit 5", timeout=30)
            assert (res.exit_code, res.output, res.timed_out) == (5, "a\nb\n", False)
            timed = await sb.exec("echo s; sleep 60", timeout=1.0)
            assert timed.timed_out and "s" in timed.output
            await sb.write_file("f.txt", "hello")
            assert await sb.read_file("f.txt") == b"hello"
            with pytest.raises(SandboxFileNotFound):
                await sb.read_file("nope.txt")
            src = tmp_path / "src"
            src.mkdir()
            (src / "x.bin").write_bytes(b"\x00\x01" * 100)
            await sb.upload(src, "up")
            await sb.download("up", tmp_path / "down")
            assert (tmp_path / "down" / "x.bin").read_bytes() == b"\x00\x01" * 100
        finally:
            await sb.stop()
