"""LocalSandbox: real subprocesses in a real temp directory."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from rlgw.sandboxes.base import Sandbox, SandboxCommandError, SandboxFileNotFound
from rlgw.sandboxes.local import LocalSandbox, marked_pids, running


@pytest.fixture
async def box(tmp_path: Path):
    sb = LocalSandbox(base_dir=tmp_path)
    await sb.start()
    yield sb
    await sb.stop()


async def test_protocol_and_honest_isolation(box: LocalSandbox) -> None:
    assert isinstance(box, Sandbox)
    # No bwrap on this machine: the sandbox says it isolates nothing.
    assert box.isolation in ("none", "bubblewrap")
    assert box.root.joinpath("workspace").as_posix() == box.workdir
    assert (await box.exec(f"test -d {box.scratch}")).ok


async def test_exec_env_cwd_exit_code_and_stderr(box: LocalSandbox) -> None:
    await box.write_file("sub/a.txt", "hello")
    res = await box.exec('cat a.txt; echo " $FOO"; echo oops >&2; exit 3', env={"FOO": "bar"}, cwd="sub")
    assert res.exit_code == 3 and not res.timed_out and not res.ok
    assert "hello bar" in res.output and "oops" in res.output
    home = await box.exec("echo $HOME")
    assert home.output.strip().startswith(str(box.root))


async def test_timeout_kills_the_whole_process_group(box: LocalSandbox) -> None:
    marker = Path(box.workdir) / "survived"
    t0 = time.monotonic()
    res = await box.exec(f"(sleep 3; touch {marker}) & echo started; sleep 30", timeout=0.5)
    assert res.timed_out and res.exit_code is None
    assert "started" in res.output
    assert time.monotonic() - t0 < 5
    await asyncio.sleep(3.5)
    assert not marker.exists(), "a child of the timed-out command kept running"


async def test_files_roundtrip_and_errors(box: LocalSandbox, tmp_path: Path) -> None:
    await box.write_file("bin.dat", bytes(range(256)))
    assert await box.read_file("bin.dat") == bytes(range(256))
    with pytest.raises(SandboxFileNotFound):
        await box.read_file("missing.txt")
    with pytest.raises(SandboxCommandError, match="outside sandbox"):
        await box.write_file("/etc/rlgw-should-not-exist", "x")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("deep")
    await box.upload(src, "up")
    assert (await box.exec("cat up/d/f.txt")).output == "deep"
    out = tmp_path / "down"
    await box.download("up", out)
    assert (out / "d" / "f.txt").read_text() == "deep"


async def test_stop_removes_everything_and_is_idempotent(tmp_path: Path) -> None:
    sb = LocalSandbox(base_dir=tmp_path)
    await sb.start()
    root = sb.root
    task = asyncio.create_task(sb.exec("sleep 30"))
    await asyncio.sleep(0.3)
    await sb.stop()
    await sb.stop()
    assert not root.exists()
    res = await asyncio.wait_for(task, 5)
    assert res.exit_code != 0


async def test_a_daemon_is_found_while_it_execs(box: LocalSandbox) -> None:
    # Each `nohup` is an exec, during which the process's environment reads empty: read right
    # after the launch, again and again, the daemon must be found every time (a miss in CI let
    # the read after the test's wait find nothing; at stop it would leave the daemon running).
    res = await box.exec(
        "setsid nohup nohup nohup nohup nohup sleep 300 >/dev/null 2>&1 < /dev/null & echo $!"
    )
    pid = int(res.output.strip())
    seen = [pid in marked_pids(box.id) for _ in range(30)]
    assert all(seen), seen


async def test_stop_kills_daemons_that_left_the_process_group(tmp_path: Path) -> None:
    sb = LocalSandbox(base_dir=tmp_path)
    await sb.start()
    # As a tmux server or a jupyter kernel does: a new session, detached, outliving the command.
    res = await sb.exec("setsid nohup sleep 300 >/dev/null 2>&1 < /dev/null & echo $!")
    pid = int(res.output.strip())
    # /proc/<pid>/environ reads empty while the child is still exec-ing: give it a moment.
    for _ in range(40):
        if pid in marked_pids(sb.id):
            break
        await asyncio.sleep(0.05)
    assert res.ok and pid in marked_pids(sb.id)
    await sb.stop()
    assert marked_pids(sb.id) == []
    assert running([pid]) == []
