"""OpenHands: command lines, environment, capture settings, and the event parsers on recorded logs."""

from __future__ import annotations

import dataclasses
import shlex
import tomllib

import orjson
import pytest

from rlgw.scaffolds.locks import MissingLockError, lock_for
from rlgw.scaffolds.openhands import OpenHandsScaffold
from rlgw.scaffolds.scaffold import CaptureConflictError, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R
from tests.support.scaffold_helpers import ctx, log


def reason(sc: OpenHandsScaffold, info: TrajectoryInfo, exit_code: int | None = 0, timed_out=False) -> R:
    return sc.termination_reason(infra_error=False, timed_out=timed_out, exit_code=exit_code, trajectory=info)


def test_v0_capture_command_env_and_config() -> None:
    sc = OpenHandsScaffold(version="v0", openhands_version="0.59.0")
    c = ctx("capture")
    sc.check_mode("capture")
    cmd = sc.run_command(c)
    assert cmd.startswith("/opt/openhands-venv/bin/python -m openhands.core.main -t ")
    assert "--config-file /rlgw/scaffold/config.toml -d /workspace -i 3" in cmd
    # The agent's exit status survives the merge of its persisted events into one list.
    assert "status=${PIPESTATUS[0]}; " in cmd and cmd.endswith("/rlgw/scaffold/events.json; exit $status")
    assert "/sessions/*/events/*.json" in cmd
    env = sc.env(c)
    assert env["LLM_BASE_URL"] == "http://gw:8000/s/abc/v1" and env["LLM_API_KEY"] == "sk-session"
    assert env["LLM_MODEL"] == "openai/tiny" and env["LLM_NATIVE_TOOL_CALLING"] == "true"
    assert env["SAVE_TRAJECTORY_PATH"] == "/rlgw/scaffold/trajectory.json" and env["MAX_ITERATIONS"] == "3"
    config = tomllib.loads(sc.install_files(c)["/rlgw/scaffold/config.toml"])
    assert config["condenser"] == {"type": "noop"}
    assert config["agent"]["enable_history_truncation"] is False
    installs = sc.install_commands(c)
    assert installs[0] == "tmux -V"
    assert "--no-deps -r /rlgw/scaffold/openhands-ai-0.59.0.txt" in installs[1]
    assert "import openhands.core.main; import libtmux" in installs[1]
    sampled = sc.env(dataclasses.replace(c, sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 64}))
    assert (sampled["LLM_TEMPERATURE"], sampled["LLM_TOP_P"], sampled["LLM_MAX_OUTPUT_TOKENS"]) == (
        "0.7",
        "0.9",
        "64",
    )
    assert "LLM_TEMPERATURE" not in env  # unset sampling: OpenHands' own default


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
    c = dataclasses.replace(ctx("capture"), sampling={"temperature": 0.5})
    argv = shlex.split(sc.run_command(c).split(" -t ")[0])
    assert argv[:2] == ["/opt/openhands-venv/bin/python", "/rlgw/scaffold/v1_launcher.py"]
    assert argv[2:] == ["--max-iterations", "3", "--condenser", "off", "--sampling", '{"temperature":0.5}',
                        "--state-out", "/rlgw/scaffold/state.json", "--headless", "--json"]  # fmt: skip
    assert "tee /rlgw/scaffold/events.jsonl" in sc.run_command(c)
    assert "--condenser default" in sc.run_command(ctx("eval"))  # eval: the CLI's own condenser
    assert "class" not in sc.install_files(c)["/rlgw/scaffold/instruction.md"]
    assert "max_iteration_per_run" in sc.install_files(c)["/rlgw/scaffold/v1_launcher.py"]
    env = sc.env(c)
    assert (
        env["OPENHANDS_PERSISTENCE_DIR"] == "/rlgw/scaffold/persistence" and "SAVE_TRAJECTORY_PATH" not in env
    )
    (install,) = sc.install_commands(c)
    assert (
        "--no-deps -r /rlgw/scaffold/openhands-1.16.0.txt" in install
        and "import openhands_cli.entrypoint" in install
    )
    assert (
        sc.install_files(c)["/rlgw/scaffold/openhands-1.16.0.txt"] == lock_for("openhands", "1.16.0").text()
    )
    with pytest.raises(
        MissingLockError, match=r"no dependency lock for openhands 1\.2\.3 \(locked: 1\.16\.0\)"
    ):
        OpenHandsScaffold(version="v1", openhands_version="1.2.3").install_commands(c)
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
    ],
)
def test_v1_events(fixture: str, expected: R, turns: int) -> None:
    sc = OpenHandsScaffold(version="v1")
    info = sc.parse_trajectory(ctx(), {"events": log(fixture)}, "", 0)
    assert reason(sc, info) is expected and info.turns == turns
    # The same events read from stdout when the tee'd file is missing.
    from_stdout = sc.parse_trajectory(ctx(), {}, "noise line\n" + log(fixture).decode(), 0)
    assert reason(sc, from_stdout) is expected


@pytest.mark.parametrize(
    ("name", "expected", "detail"),
    [
        ("finish", R.FINISH, '"max_iterations":3,"condenser":null'),
        ("context", R.CONTEXT_LENGTH_EXCEEDED, "maximum context length is 8192"),
        ("notfound", R.ERROR, "NotFoundError"),
    ],
)
def test_v1_cli_logs_recorded_from_real_runs(name: str, expected: R, detail: str) -> None:
    """Stdout (`--json`) and `base_state.json` of real `openhands` 1.16.0 runs against rlgw."""
    sc = OpenHandsScaffold(version="v1")
    logs = {
        "events": log(f"openhands_v1_cli_{name}.jsonl"),
        "state": log(f"openhands_v1_cli_{name}_state.json"),
    }
    info = sc.parse_trajectory(ctx(), logs, "", 0)
    assert reason(sc, info) is expected and detail in info.detail


def test_v1_recoverable_agent_error_is_not_fatal() -> None:
    sc = OpenHandsScaffold(version="v1")
    events = [{"kind": "AgentErrorEvent", "error": "Tool 'get_weather' not found"},
              {"kind": "ActionEvent", "action": {"kind": "FinishAction"}}]  # fmt: skip
    text = "\n".join(orjson.dumps(e).decode() for e in events).encode()
    info = sc.parse_trajectory(ctx(), {"events": text}, "", 0)
    assert reason(sc, info) is R.FINISH and "recovered from" in info.detail
    state = b'{"execution_status": "finished"}'
    alone = sc.parse_trajectory(ctx(), {"events": text.split(b"\n")[0], "state": state}, "", 0)
    assert reason(sc, alone) is R.FINISH


def test_v0_console_fallback_strips_colour() -> None:
    sc = OpenHandsScaffold(version="v0")
    coloured = (
        "\x1b[92m10:00:01 - openhands:INFO\x1b[0m: Setting agent(CodeActAgent) state from "
        "AgentState.RUNNING to AgentState.ERROR\n"
        "\x1b[31m10:00:01 - openhands:ERROR\x1b[0m: Agent reached maximum iteration. "
        "Current iteration: 3, max: 3\n"
    )
    info = sc.parse_trajectory(ctx(), {"log": coloured.encode()}, "", 0)
    assert reason(sc, info) is R.MAX_TURNS and "\x1b" not in info.detail
