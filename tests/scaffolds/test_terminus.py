"""Terminus-2: command line, environment, summarization rules, and its termination table."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.scaffold import CaptureConflictError
from rlgw.scaffolds.termination import TerminationReason as R
from rlgw.scaffolds.terminus import Terminus2Scaffold
from tests.support.scaffold_helpers import ctx, log


def test_capture_command_forces_summarization_off() -> None:
    sc = Terminus2Scaffold()
    c = ctx("capture", max_turns=4)
    argv = shlex.split(sc.run_command(c).split(" 2>&1 ")[0])
    assert argv[:2] == ["/opt/terminus-venv/bin/python", "/rlgw/scaffold/launcher.py"]
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert opts == {
        "--instruction-file": "/rlgw/scaffold/instruction.md", "--model": "openai/tiny",
        "--api-base": "http://gw:8000/s/abc/v1", "--max-turns": "4", "--enable-summarize": "false",
        "--logs-dir": "/rlgw/scaffold/logs", "--workdir": "/workspace", "--sampling": "{}",
    }  # fmt: skip
    sampled = dataclasses.replace(c, sampling={"temperature": 0.3, "top_p": 0.9})
    assert '--sampling \'{"temperature":0.3,"top_p":0.9}\'' in sc.run_command(sampled)
    assert sc.env(c)["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert sc.env(c)["OPENAI_API_KEY"] == "sk-session"
    files = sc.install_files(c)
    assert "class HostEnvironment" in files["/rlgw/scaffold/launcher.py"]
    # harbor's committed lock is written beside the launcher and installed as it is, unless already marked.
    lock = lock_for("harbor", "0.26.0")
    assert files["/rlgw/scaffold/harbor-0.26.0.txt"] == lock.text()
    install = sc.install_commands(c)
    assert install[1].startswith(f"test -f /opt/terminus-venv/.rlgw-lock-{lock.digest()} || (")
    assert "--no-deps -r /rlgw/scaffold/harbor-0.26.0.txt" in install[1]
    assert sc.log_paths(c)["trajectory"] == "/rlgw/scaffold/logs/trajectory.json"


def test_summarization_rules() -> None:
    with pytest.raises(CaptureConflictError, match="summarization"):
        Terminus2Scaffold(enable_summarize=True).check_mode("capture")
    Terminus2Scaffold(enable_summarize=False).check_mode("capture")
    assert "--enable-summarize true" in Terminus2Scaffold().run_command(ctx("eval"))
    assert "--enable-summarize false" in Terminus2Scaffold(enable_summarize=False).run_command(ctx("eval"))


@pytest.mark.parametrize(
    ("logs", "exit_code", "timed_out", "expected", "turns"),
    [
        ({"trajectory": "terminus2_complete.json"}, 0, False, R.FINISH, 3),
        ({"trajectory": "terminus2_max_turns.json"}, 0, False, R.MAX_TURNS, 4),
        ({"trajectory": "terminus2_stopped_early.json"}, 0, False, R.FINISH, 1),
        ({"trajectory": "terminus2_complete.json"}, 1, False, R.ERROR, 3),  # non-zero defers to base
        ({"trajectory": "terminus2_max_turns.json", "log": "terminus2_context.log"}, 1, False,
         R.CONTEXT_LENGTH_EXCEEDED, 4),
        ({"trajectory": "terminus2_complete.json"}, None, True, R.TIMEOUT, 3),
        ({}, 0, False, R.FINISH, 0),
        ({}, 2, False, R.ERROR, 0),
    ],
)  # fmt: skip
def test_termination_table(logs, exit_code, timed_out, expected, turns) -> None:
    sc = Terminus2Scaffold()
    info = sc.parse_trajectory(ctx(max_turns=4), {k: log(v) for k, v in logs.items()}, "", exit_code)
    got = sc.termination_reason(infra_error=False, timed_out=timed_out, exit_code=exit_code, trajectory=info)
    assert got is expected and info.turns == turns
    assert sc.termination_reason(infra_error=True, timed_out=timed_out, exit_code=exit_code,
                                 trajectory=info) is R.INFRA_ERROR  # fmt: skip
