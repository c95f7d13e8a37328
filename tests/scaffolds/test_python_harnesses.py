"""mini-swe-agent, aider and hermes-agent scaffolds, offline: their commands, settings and history switches,
and how their own records (mini's trajectory `exit_status`, aider's output and LLM log, hermes's usage report
and final answer) become termination reasons."""

from __future__ import annotations

import dataclasses
import json
import shlex

import orjson
import pytest

from rlgw.scaffolds.aider import NO_SUMMARY_TOKENS, parse_aider_output
from rlgw.scaffolds.hermes import DEFAULT_MAX_TOKENS, HermesScaffold, parse_hermes_usage
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.mini_swe_agent import MiniSweAgentScaffold, parse_mini_trajectory
from rlgw.scaffolds.registry import build_scaffold
from rlgw.scaffolds.termination import TerminationReason as R
from tests.support.scaffold_helpers import ctx


def test_mini_swe_agent_command_config_and_locked_install() -> None:
    sc = build_scaffold("mini-swe-agent", {"venv": "/v"})
    c = dataclasses.replace(ctx("capture", max_turns=5), sampling={"temperature": 0.3})
    argv = shlex.split(sc.run_command(c).split(" && ", 1)[1].split(" -t ")[0])
    assert argv == ["/v/bin/mini", "-y", "--exit-immediately", "-c", "mini.yaml",
                    "-c", "/rlgw/scaffold/rlgw.yaml", "-o", "/rlgw/scaffold/mini.traj.json"]  # fmt: skip
    files = sc.install_files(c)
    config = json.loads(files["/rlgw/scaffold/rlgw.yaml"])
    assert config["model"] == {
        "model_name": "openai/tiny", "cost_tracking": "ignore_errors",
        "model_kwargs": {"api_base": "http://gw:8000/s/abc/v1", "api_key": "sk-session", "temperature": 0.3},
    }  # fmt: skip
    assert config["agent"] == {"step_limit": 5, "cost_limit": 0}
    assert files["/rlgw/scaffold/mini-swe-agent-2.4.6.txt"] == lock_for("mini-swe-agent", "2.4.6").text()
    (install,) = sc.install_commands(c)
    assert (
        "--no-deps -r /rlgw/scaffold/mini-swe-agent-2.4.6.txt" in install
        and "import minisweagent.run.mini" in install
    )
    assert sc.env(c)["MSWEA_CONFIGURED"] == "true"


@pytest.mark.parametrize(
    ("status", "expected"),
    [("Submitted", R.FINISH), ("LimitsExceeded", R.MAX_TURNS),
     ("ContextWindowExceededError", R.CONTEXT_LENGTH_EXCEEDED), ("RepeatedFormatError", R.ERROR),
     ("APIConnectionError", R.ERROR)],
)  # fmt: skip
def test_mini_swe_agent_termination_is_its_exit_status(status: str, expected: R) -> None:
    traj = {"info": {"exit_status": status, "model_stats": {"api_calls": 4}}, "messages": []}
    info = parse_mini_trajectory(orjson.dumps(traj))
    assert info.signals == {expected} and info.turns == 4 and info.detail == f"exit_status={status}"
    sc = MiniSweAgentScaffold()
    assert sc.termination_reason(infra_error=False, timed_out=False, exit_code=0, trajectory=info) is expected
    # No trajectory (killed before its first save): the exit code decides.
    empty = parse_mini_trajectory(None)
    assert sc.termination_reason(infra_error=False, timed_out=False, exit_code=1, trajectory=empty) is R.ERROR


def test_aider_command_settings_and_summary_switch() -> None:
    sc = build_scaffold("aider", {"venv": "/v"})
    c = dataclasses.replace(ctx("capture"), sampling={"temperature": 0.7, "top_p": 0.9})
    cmd = sc.run_command(c)
    argv = shlex.split(cmd.split(" && ", 1)[1].split(" --message ")[0])
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/v/bin/aider" and opts["--model"] == "openai/tiny"
    assert opts["--openai-api-base"] == "http://gw:8000/s/abc/v1" and opts["--openai-api-key"] == "sk-session"
    assert {"--yes-always", "--no-git", "--no-check-update", "--analytics-disable"} <= set(argv)
    assert f"--max-chat-history-tokens {NO_SUMMARY_TOKENS}" in cmd
    assert "--max-chat-history-tokens" not in sc.run_command(ctx("eval"))  # eval: aider's own default
    settings = json.loads(sc.install_files(c)["/rlgw/scaffold/model-settings.yml"])
    assert settings == [{"name": "openai/tiny", "extra_params": {"temperature": 0.7, "top_p": 0.9}}]
    assert "--no-deps -r /rlgw/scaffold/aider-chat-0.86.2.txt" in sc.install_commands(c)[0]


def test_aider_termination_from_its_output() -> None:
    log = "TO LLM 2026-12-05T04:00:00\nSYSTEM ...\nLLM RESPONSE 2026-12-05T04:00:01\n...\nTO LLM 04:02\n"
    done = parse_aider_output(log, "Tokens: 591 sent, 38 received.\n", 0)
    assert done.turns == 2 and done.signals == {R.FINISH}
    failed = parse_aider_output("", "litellm.NotFoundError: OpenAIException - session not found\n", 0)
    assert failed.signals == {R.ERROR} and failed.detail == "litellm.NotFoundError"
    full = parse_aider_output("", "Model openai/tiny has hit a token limit!\n", 0)
    assert full.signals == {R.CONTEXT_LENGTH_EXCEEDED}
    assert parse_aider_output("", "Traceback ...", 1).signals == set()  # the exit code decides: error


def test_hermes_command_config_and_compression_switch() -> None:
    sc = build_scaffold("hermes", {"venv": "/v"})
    c = ctx("capture")
    cmd = sc.run_command(c)
    argv = shlex.split(cmd.split(" && ", 1)[1].split(" -z ")[0])
    assert argv == [
        "/v/bin/hermes",
        "-m",
        "tiny",
        "--provider",
        "custom",
        "--usage-file",
        "/rlgw/scaffold/usage.json",
    ]
    config = json.loads(sc.install_files(c)["/rlgw/scaffold/hermes-home/config.yaml"])
    assert config == {
        "model": {"provider": "custom", "base_url": "http://gw:8000/s/abc/v1", "api_key": "sk-session",
                  "default": "tiny", "api_mode": "chat_completions", "max_tokens": DEFAULT_MAX_TOKENS},
        "compression": {"enabled": False},
    }  # fmt: skip
    capped = dataclasses.replace(ctx("eval"), sampling={"max_tokens": 512})
    eval_config = json.loads(sc.install_files(capped)["/rlgw/scaffold/hermes-home/config.yaml"])
    assert "compression" not in eval_config and eval_config["model"]["max_tokens"] == 512  # eval: its default
    env = sc.env(c)
    assert env["HERMES_HOME"] == "/rlgw/scaffold/hermes-home" and env["TIRITH_ENABLED"] == "0"
    assert "--no-deps -r /rlgw/scaffold/hermes-agent-0.19.0.txt" in sc.install_commands(c)[0]


def usage(**fields: object) -> bytes:
    return orjson.dumps({"api_calls": 2, "completed": True, "failed": False, **fields})


@pytest.mark.parametrize(
    ("report", "output", "code", "expected"),
    [
        (usage(), "Created hello.txt.\n", 0, R.FINISH),
        (usage(), "⚠️ No reply: the model returned empty content after retries and any fallback providers.", 0,
         R.ERROR),
        (usage(api_calls=90), "⚠️ No reply: the maximum tool-iteration limit was reached.",
         0, R.MAX_TURNS),
        (usage(completed=False, failed=True, api_calls=1),
         "Context overflow and auto-compaction is disabled (compression.enabled: false).", 0,
         R.CONTEXT_LENGTH_EXCEEDED),
        (usage(completed=False, failed=True, failure="Connection refused"), "hermes -z: agent failed", 1,
         R.ERROR),
    ],
)  # fmt: skip
def test_hermes_termination_from_its_report_and_answer(
    report: bytes, output: str, code: int, expected: R
) -> None:
    info = parse_hermes_usage(report, output, code)
    assert info.signals == {expected} and info.turns == orjson.loads(report)["api_calls"]
    sc = HermesScaffold()
    assert (
        sc.termination_reason(infra_error=False, timed_out=False, exit_code=code, trajectory=info) is expected
    )
    # No report (killed before it wrote one): the exit code decides.
    assert parse_hermes_usage(None, "", 1).signals == set()
