"""OpenHands: command lines, environment, capture settings, and the event parsers on recorded logs."""

from __future__ import annotations

import tomllib

import pytest

from rlgw.scaffolds.openhands import OpenHandsScaffold
from rlgw.scaffolds.scaffold import CaptureConflictError, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R
from tests.scaffolds.helpers import ctx, log


def reason(sc: OpenHandsScaffold, info: TrajectoryInfo, exit_code: int | None = 0, timed_out=False) -> R:
    return sc.termination_reason(infra_error=False, timed_out=timed_out, exit_code=exit_code, trajectory=info)


def test_v0_capture_command_env_and_config() -> None:
    sc = OpenHandsScaffold(version="v0", openhands_version="0.59.0")
    c = ctx("capture")
    sc.check_mode("capture")
    cmd = sc.run_command(c)
    assert cmd.startswith("/opt/openhands-venv/bin/python -m openhands.core.main -t ")
    assert "--config-file /rlgw/scaffold/config.toml -d /workspace -i 3" in cmd
    assert "exit ${PIPESTATUS[0]}" in cmd
    env = sc.env(c)
    assert env["LLM_BASE_URL"] == "http://gw:8000/s/abc/v1" and env["LLM_API_KEY"] == "sk-session"
    assert env["LLM_MODEL"] == "openai/tiny" and env["LLM_NATIVE_TOOL_CALLING"] == "true"
    assert env["SAVE_TRAJECTORY_PATH"] == "/rlgw/scaffold/trajectory.json" and env["MAX_ITERATIONS"] == "3"
    config = tomllib.loads(sc.install_files(c)["/rlgw/scaffold/config.toml"])
    assert config["condenser"] == {"type": "noop"}
    assert config["agent"]["enable_history_truncation"] is False
    installs = sc.install_commands(c)
    assert any("openhands-ai==0.59.0" in line for line in installs)
    assert installs[-1].endswith("-m openhands.core.main --version")


def test_eval_leaves_history_settings_alone_and_capture_refuses_them() -> None:
    sc = OpenHandsScaffold(condenser="llm", history_truncation=True)
    with pytest.raises(CaptureConflictError, match="condenser 'llm'"):
        sc.check_mode("capture")
    with pytest.raises(CaptureConflictError, match="truncation"):
        OpenHandsScaffold(history_truncation=True).check_mode("capture")
    sc.check_mode("eval")
    config = tomllib.loads(sc.install_files(ctx("eval"))["/rlgw/scaffold/config.toml"])
    assert config["condenser"] == {"type": "llm"} and config["agent"]["enable_history_truncation"] is True
    unset = tomllib.loads(OpenHandsScaffold().install_files(ctx("eval"))["/rlgw/scaffold/config.toml"])
    assert "condenser" not in unset and "enable_history_truncation" not in unset["agent"]


def test_v1_command_and_env() -> None:
    sc = OpenHandsScaffold(version="v1")
    c = ctx("capture")
    cmd = sc.run_command(c)
    assert cmd.startswith("/opt/openhands-venv/bin/openhands --headless --json -t ")
    assert "tee /rlgw/scaffold/events.jsonl" in cmd
    env = sc.env(c)
    assert env["OPENHANDS_CONDENSER"] == "noop" and "SAVE_TRAJECTORY_PATH" not in env
    assert "OPENHANDS_CONDENSER" not in sc.env(ctx("eval"))
    with pytest.raises(ValueError, match="v0"):
        OpenHandsScaffold(version="v2")


@pytest.mark.parametrize(
    ("fixture", "expected", "turns"),
    [
        ("openhands_v0_finished.json", R.FINISH, 3),
        ("openhands_v0_rejected.json", R.REJECT, 2),
        ("openhands_v0_max_iterations.json", R.MAX_TURNS, 3),
        ("openhands_v0_budget.json", R.BUDGET, 2),
        ("openhands_v0_stuck.json", R.STUCK, 3),
        ("openhands_v0_context_window.json", R.CONTEXT_LENGTH_EXCEEDED, 2),
        ("openhands_v0_error.json", R.ERROR, 1),
    ],
)
def test_v0_trajectories(fixture: str, expected: R, turns: int) -> None:
    sc = OpenHandsScaffold(version="v0")
    # OpenHands exits 0 after an error state: the events decide, not the exit code.
    info = sc.parse_trajectory(ctx(), {"trajectory": log(fixture)}, "", 0)
    assert reason(sc, info) is expected
    assert info.turns == turns


def test_v0_console_log_when_no_trajectory_was_saved() -> None:
    sc = OpenHandsScaffold(version="v0")
    info = sc.parse_trajectory(ctx(), {"log": log("openhands_v0_console_error.log")}, "", 0)
    assert reason(sc, info) is R.MAX_TURNS and "maximum iteration" in info.detail
    nothing = sc.parse_trajectory(ctx(), {}, "", 1)
    assert reason(sc, nothing, exit_code=1) is R.ERROR
    assert reason(sc, nothing, exit_code=0) is R.FINISH
    # A timeout wins over whatever the partial log says.
    partial = sc.parse_trajectory(ctx(), {"trajectory": log("openhands_v0_finished.json")}, "", None)
    assert reason(sc, partial, exit_code=None, timed_out=True) is R.TIMEOUT


@pytest.mark.parametrize(
    ("fixture", "expected", "turns"),
    [
        ("openhands_v1_finished.jsonl", R.FINISH, 3),
        ("openhands_v1_stuck.jsonl", R.STUCK, 4),
        ("openhands_v1_max_iterations.jsonl", R.MAX_TURNS, 3),
        ("openhands_v1_context_window.jsonl", R.CONTEXT_LENGTH_EXCEEDED, 2),
    ],
)
def test_v1_events(fixture: str, expected: R, turns: int) -> None:
    sc = OpenHandsScaffold(version="v1")
    info = sc.parse_trajectory(ctx(), {"events": log(fixture)}, "", 0)
    assert reason(sc, info) is expected and info.turns == turns
    # The same events read from stdout when the tee'd file is missing.
    from_stdout = sc.parse_trajectory(ctx(), {}, "noise line\n" + log(fixture).decode(), 0)
    assert reason(sc, from_stdout) is expected
