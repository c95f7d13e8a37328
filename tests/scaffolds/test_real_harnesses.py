"""The Python harnesses (mini-swe-agent, aider, hermes-agent), each from its committed lock, run for real
through `rlgw serve` on tiny-agent and checked token-exact as the npm CLIs are
(`tests/support/tiny_agent_runs.py`).

tiny-agent was taught their first requests (`tests/fixtures/build_agent_fixture.py`): it answers
mini-swe-agent with its `bash` call, then its submit command; aider (no tools) with the edit as a file
listing in the "whole" format aider's prompt asks for; hermes-agent with its `terminal` call, then an
answer. Each test asserts what the harness does with that: what the model said, its requests, samples,
conversations and causes, its own termination, and the verifier's reward.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgw.scaffolds import aider, hermes, mini_swe_agent
from rlgw.scaffolds.aider import AiderScaffold
from rlgw.scaffolds.hermes import HermesScaffold
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.mini_swe_agent import MiniSweAgentScaffold
from rlgw.scaffolds.termination import TerminationReason as R
from tests.fixtures.build_agent_fixture import CALLS, SUBMIT_CALL, TASKS
from tests.support.agent_venvs import locked_venv
from tests.support.e2e import Stack
from tests.support.tiny_agent_runs import run_on_tiny_agent

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]


async def test_mini_swe_agent(agent_stack: Stack, tmp_path: Path) -> None:
    venv = locked_venv("mini-swe-agent", lock_for("mini-swe-agent", "2.4.6"), mini_swe_agent.IMPORTS)
    scaffold = MiniSweAgentScaffold(venv=str(venv))
    done = await run_on_tiny_agent(agent_stack, scaffold, tmp_path, "mini-swe-agent", TASKS["mini-swe-agent"])
    r = done.result
    # The `bash` call writes hello.txt; after its result the model runs mini's submit command, which ends
    # the run (`Submitted`): one conversation of two requests.
    assert r.failed_stage is None and r.exit_code == 0, done.detail
    assert r.termination is R.FINISH and r.detail == "exit_status=Submitted", done.detail
    assert r.reward == 1.0 and not r.rejects, done.detail
    assert done.said(CALLS["mini-swe-agent"]) and done.said(SUBMIT_CALL), done.replies
    assert done.causes == ["start"] and done.spans == [2], (done.causes, done.spans)
    assert done.conversations == [0] and done.leftovers == []


async def test_aider(agent_stack: Stack, tmp_path: Path) -> None:
    venv = locked_venv("aider", lock_for("aider-chat", "0.86.2"), aider.IMPORTS)
    done = await run_on_tiny_agent(
        agent_stack, AiderScaffold(venv=str(venv)), tmp_path, "aider", TASKS["aider"]
    )
    r = done.result
    # aider sends no tools (its edits are text, in its "whole" format for a model it does not know): the model
    # answers with hello.txt's file listing, which aider applies. One request, and aider exits 0 after its
    # `--message` as it always does.
    assert r.failed_stage is None and r.exit_code == 0 and r.turns == 1, done.detail
    assert r.termination is R.FINISH and "Applied edit to hello.txt" in r.output_tail, done.detail
    assert r.reward == 1.0 and not r.rejects, done.detail
    assert done.said(CALLS["aider"]), done.replies
    assert done.causes == ["start"] and done.spans == [1] and done.conversations == [0], done.causes
    assert done.leftovers == []


async def test_hermes(agent_stack: Stack, tmp_path: Path) -> None:
    venv = locked_venv("hermes-agent", lock_for("hermes-agent", "0.19.0"), hermes.IMPORTS)
    scaffold = HermesScaffold(venv=str(venv))
    done = await run_on_tiny_agent(agent_stack, scaffold, tmp_path, "hermes", TASKS["hermes"])
    r = done.result
    # Its `terminal` tool (one of 27) writes hello.txt; `-z` prints the answer and exits: one conversation of
    # two requests, no side call.
    assert r.failed_stage is None and r.exit_code == 0, done.detail
    assert r.termination is R.FINISH and r.reward == 1.0 and not r.rejects, done.detail
    assert done.said(CALLS["hermes"]), done.replies
    assert done.causes == ["start"] and done.spans == [2], (done.causes, done.spans)
    assert done.conversations == [0] and done.leftovers == []
