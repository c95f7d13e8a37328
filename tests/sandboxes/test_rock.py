"""The ROCK client against the fake ROCK server, and the fake server against ROCK's own SDK."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlgw.sandboxes.base import Sandbox, SandboxCommandError, SandboxFileNotFound, SandboxStartError
from rlgw.sandboxes.rock import RockConfig, RockSandbox
from tests.fake_rock import fake_rock

KEY = "rock-test-key"


@pytest.fixture(scope="module")
def rock_url(tmp_path_factory: pytest.TempPathFactory):
    with fake_rock(tmp_path_factory.mktemp("rock"), api_key=KEY, startup_delay=0.3) as url:
        yield url


def config(url: str, **kw) -> RockConfig:
    return RockConfig(base_url=url, api_key=KEY, workdir="$HOME/workspace", scratch="$HOME/rlgw",
                      poll_interval_s=0.1, **kw)  # fmt: skip


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

        await sb.create_session("s1", env={"GREETING": "hi"})
        await sb.run_in_session("cd /tmp && export X=42", session="s1")
        assert (await sb.run_in_session('echo "$X $GREETING $(pwd)"', session="s1")).strip() == "42 hi /tmp"
        await sb.close_session("s1")
        with pytest.raises(SandboxCommandError, match="does not exist"):
            await sb.run_in_session("true", session="s1")
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
