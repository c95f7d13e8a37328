"""InstalledAgent lifecycle on real local sandboxes with rlgw-mini: stages, rewards, teardown after failures.

The gateway here is a recording stand-in for `GatewayClient` (the real one is exercised in
`test_end_to_end.py`); the agent talks to a closed port, so its run ends in its own `error`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from rlgw.gateway.errors import RolloutStored
from rlgw.gateway.trajectories.client import RolloutStoredError
from rlgw.sandboxes.base import SandboxCommandError
from rlgw.sandboxes.local import LocalSandbox
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent
from rlgw.scaffolds.mini import MiniScaffold
from rlgw.scaffolds.openhands import OpenHandsScaffold
from rlgw.scaffolds.scaffold import CaptureConflictError
from rlgw.scaffolds.tasks import Task, Verifier
from rlgw.scaffolds.termination import TerminationReason as R
from tests.support.procs import free_port

TASK = Task(
    "calc",
    "Fix add().",
    setup_files={"calc.py": "def add(a, b):\n    return a + b\n"},
    verifier=Verifier(
        "python -c 'import calc; assert calc.add(2, 3) == 5' && echo 0.75 > $RLGW_REWARD_DIR/reward.txt"
    ),
)


@dataclass
class RecordingGateway:
    fail_on: str | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def create_session(self, task_id: str, **kw: Any) -> Any:
        self.calls.append(("create", kw))
        if self.fail_on == "create":
            raise ConnectionError("gateway down")
        if self.fail_on == "stored":  # the gateway's own 409 for a rollout whose finish is stored
            error = RolloutStored(kw["rollout_id"], STORED).body()["error"]
            raise RolloutStoredError(409, error["message"], error, "http://gw/v1/sessions")
        return SimpleNamespace(session_id="s-1", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k",
                               mode=kw["mode"], rollout_id=kw["rollout_id"])  # fmt: skip

    async def finish_session(self, session_id: str, **kw: Any) -> Any:
        self.calls.append(("finish", kw))
        if self.fail_on == "finish":
            raise ConnectionError("gateway down at finish")
        if self.fail_on == "stored-at-finish":  # another live attempt of the rollout stored it first
            error = RolloutStored("r-1", STORED).body()["error"]
            raise RolloutStoredError(
                409, error["message"], error, f"http://gw/v1/sessions/{session_id}/finish"
            )
        return SimpleNamespace(trainable_tokens=0, samples=[], rejects=[])

    async def delete_session(self, session_id: str) -> None:
        self.calls.append(("delete", session_id))


STORED = {
    "session_id": "s-0",
    "samples": [{"cursor": 7, "segment": 0, "conversation": 0, "trainable_tokens": 5, "response_length": 9}],
    "trainable_tokens": 5,
    "segments": 1,
    "rejects": [],
    "termination_reason": "finish",
    "reward": 0.75,
    "status": "completed",
}


class FaultySandbox(LocalSandbox):
    """A real local sandbox that fails one chosen operation (`which` counts sandboxes from 0)."""

    made: ClassVar[list[FaultySandbox]] = []

    def __init__(self, base: Path, fail: str | None, which: int):
        super().__init__(base_dir=base)
        self.fail, self.which, self.index = fail, which, len(FaultySandbox.made)
        self.stopped = False
        FaultySandbox.made.append(self)

    def _maybe_fail(self, op: str) -> None:
        if self.fail == op and self.index == self.which:
            raise SandboxCommandError(f"injected failure in {op}")

    async def start(self) -> None:
        self._maybe_fail("start")
        await super().start()

    async def write_file(self, path: str, content: str | bytes) -> None:
        self._maybe_fail("write_file")
        await super().write_file(path, content)

    async def exec(self, command: str, **kw: Any):
        if "trajectory.jsonl" in command:  # the agent's run command
            self._maybe_fail("run")
        return await super().exec(command, **kw)

    async def download(self, remote: str, local: Path) -> None:
        self._maybe_fail("download")
        await super().download(remote, local)

    async def read_file(self, path: str) -> bytes:
        self._maybe_fail("read_file")
        return await super().read_file(path)

    async def stop(self) -> None:
        self.stopped = True
        await super().stop()


class QuickMini(MiniScaffold):
    """rlgw-mini whose run only writes a `finish` event: the stage tests need no LLM call."""

    def run_command(self, ctx) -> str:
        return f'echo \'{{"event": "finish", "turns": 1}}\' > {ctx.home}/trajectory.jsonl'


def make_agent(tmp_path: Path, gateway: RecordingGateway, fail: str | None = None, which: int = 0,
               python: str = sys.executable, quick: bool = True) -> InstalledAgent:  # fmt: skip
    FaultySandbox.made = []
    return InstalledAgent(
        (QuickMini if quick else MiniScaffold)(python=python),
        lambda: FaultySandbox(tmp_path, fail, which),
        gateway,
        AgentConfig(mode="capture", model="tiny", max_turns=2, agent_timeout_s=60, install_timeout_s=60),
    )


async def test_clean_run_grades_and_finishes_the_session(tmp_path: Path) -> None:
    gw = RecordingGateway()
    result = await make_agent(tmp_path, gw, quick=False).run(TASK, rollout_id="r-1", group_index=2)
    assert result.failed_stage is None and result.reward == 0.75
    assert result.termination is R.ERROR and result.status == "failed"  # the agent could not reach its LLM
    create = gw.calls[0][1]
    assert create["mode"] == "capture" and create["rollout_id"] == "r-1" and create["group_index"] == 2
    assert gw.calls[1][0] == "finish"
    assert gw.calls[1][1]["reward"] == 0.75 and gw.calls[1][1]["termination_reason"] == "error"
    assert [s.stopped for s in FaultySandbox.made] == [True, True]  # agent sandbox + clean verifier sandbox
    assert all(s._root is None for s in FaultySandbox.made)


@pytest.mark.parametrize(
    ("fail", "which", "stage"),
    [
        ("start", 0, "sandbox_start"),
        ("write_file", 0, "setup"),
        ("run", 0, "run"),
        ("download", 0, "freeze"),
        ("start", 1, "verify"),
        ("read_file", 0, "logs"),
    ],
)
async def test_teardown_after_a_sandbox_failure_in_every_stage(tmp_path: Path, fail, which, stage) -> None:
    gw = RecordingGateway()
    result = await make_agent(tmp_path, gw, fail, which).run(TASK)
    assert result.failed_stage == stage and result.termination is R.INFRA_ERROR and result.status == "failed"
    assert all(s.stopped for s in FaultySandbox.made)
    if stage != "sandbox_start" and stage != "setup":
        finish = [kw for name, kw in gw.calls if name == "finish"]
        assert finish and finish[0]["termination_reason"] == "infra_error" and finish[0]["status"] == "failed"
    else:
        assert [c[0] for c in gw.calls] == []  # failed before a session was opened


async def test_teardown_after_install_session_and_finish_failures(tmp_path: Path) -> None:
    gw = RecordingGateway()
    bad_python = await make_agent(tmp_path, gw, python="/nonexistent/python3").run(TASK)
    assert bad_python.failed_stage == "install" and "install command exited" in bad_python.error
    assert FaultySandbox.made[0].stopped and [c[0] for c in gw.calls] == ["create", "finish"]

    gw = RecordingGateway(fail_on="create")
    no_session = await make_agent(tmp_path, gw).run(TASK)
    assert no_session.failed_stage == "session" and FaultySandbox.made[0].stopped

    gw = RecordingGateway(fail_on="finish")
    lost = await make_agent(tmp_path, gw).run(TASK)
    assert lost.failed_stage == "finish" and lost.termination is R.INFRA_ERROR
    assert [c[0] for c in gw.calls] == ["create", "finish", "delete"]
    assert all(s.stopped for s in FaultySandbox.made)


async def test_agent_timeout_is_classified_and_torn_down(tmp_path: Path) -> None:
    gw = RecordingGateway()
    agent = make_agent(tmp_path, gw)
    agent.config = AgentConfig(mode="capture", model="tiny", max_turns=2, agent_timeout_s=0.5)
    slow = QuickMini(python=sys.executable)
    slow.run_command = lambda ctx: "sleep 30"  # type: ignore[method-assign]
    agent.scaffold = slow
    result = await agent.run(TASK)
    assert result.termination is R.TIMEOUT and result.status == "aborted" and result.reward == 0.75
    assert all(s.stopped for s in FaultySandbox.made)


async def test_a_rollout_whose_finish_is_stored_comes_back_stored_without_running(tmp_path: Path) -> None:
    # A Ray retry of a worker that died after the gateway stored the finish: same rollout id.
    gw = RecordingGateway(fail_on="stored")
    agent = make_agent(tmp_path, gw)
    agent.scaffold.run_command = lambda ctx: pytest.fail("the agent ran again")  # type: ignore[method-assign]
    result = await agent.run(TASK, rollout_id="r-1")
    assert result.recovered and result.failed_stage is None and result.error is None
    assert (result.session_id, result.reward, result.status) == ("s-0", 0.75, "completed")
    assert result.termination is R.FINISH and "already stored" in result.detail
    assert result.samples == [{"cursor": 7, "segment": 0, "trainable_tokens": 5, "response_length": 9}]
    assert result.trainable_tokens == 5
    assert [c[0] for c in gw.calls] == ["create"]  # no finish, no delete: nothing stored twice
    assert all(s.stopped for s in FaultySandbox.made)


async def test_a_run_that_loses_its_rollout_at_finish_reports_the_stored_one(tmp_path: Path) -> None:
    # A retry that ran beside the attempt it replaced: that one finished first.
    gw = RecordingGateway(fail_on="stored-at-finish")
    result = await make_agent(tmp_path, gw).run(TASK, rollout_id="r-1")
    assert result.recovered and result.failed_stage is None and result.error is None
    assert (result.session_id, result.reward, result.status) == ("s-0", 0.75, "completed")
    assert result.samples == [{"cursor": 7, "segment": 0, "trainable_tokens": 5, "response_length": 9}]
    assert [c[0] for c in gw.calls] == ["create", "finish", "delete"]  # its own session dropped
    assert gw.calls[-1] == ("delete", "s-1")


def test_capture_conflict_fails_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(CaptureConflictError):
        InstalledAgent(OpenHandsScaffold(condenser="llm"), lambda: LocalSandbox(), RecordingGateway(),
                       AgentConfig(mode="capture"))  # fmt: skip
    with pytest.raises(ValueError, match="gateway client is needed"):
        InstalledAgent(MiniScaffold(), lambda: LocalSandbox(), None, AgentConfig(mode="capture"))
