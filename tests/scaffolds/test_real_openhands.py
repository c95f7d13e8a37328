"""OpenHands run for real on the local sandbox against a capture session: the V1 CLI (`openhands`
1.16.0) and V0 (`openhands-ai` 0.59.0), each from PyPI in its own cached venv.

Both installs take minutes (5-10 here), so they are built only with RLGW_INSTALL_AGENTS=1 and
the tests skip while the venv is missing. Forced endings: `max_turns` (a small turn limit the
tiny model uses up) and `timeout` (a wall-clock limit shorter than the turn limit needs). V1
also proves its settings took effect from the conversation's own state: the condenser is off
and the turn limit is the run's.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.openhands import IMPORTS, OpenHandsScaffold
from rlgw.scaffolds.termination import TerminationReason as R
from tests.support.agent_venvs import locked_venv
from tests.support.real_runs import TASKS, UNSOLVED_REWARD, assert_plumbing, report_line, run_real

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]


@pytest.fixture(scope="module")
def v1() -> OpenHandsScaffold:
    venv = locked_venv("openhands-cli", lock_for("openhands", "1.16.0"), IMPORTS["v1"], opt_in=True)
    return OpenHandsScaffold(version="v1", venv=str(venv))


@pytest.fixture(scope="module")
def v0() -> OpenHandsScaffold:
    venv = locked_venv("openhands-ai", lock_for("openhands-ai", "0.59.0"), IMPORTS["v0"], opt_in=True)
    return OpenHandsScaffold(version="v0", venv=str(venv))


def v1_state(tmp_path: Path) -> dict:
    (state,) = tmp_path.glob("artifacts/*/log-state")
    return orjson.loads(state.read_bytes())


async def test_v1_finish_with_its_settings_in_its_own_state(real_gateway: str, v1: OpenHandsScaffold,
                                                              tmp_path: Path) -> None:  # fmt: skip
    # The tiny model answers in plain text; V1 ends a conversation on an agent message without
    # a tool call ("finished"), which is the agent ending the task itself.
    run = await run_real(real_gateway, v1, TASKS["hello"], tmp_path, max_turns=3, agent_timeout_s=300,
                         sampling={"temperature": 0.6, "max_tokens": 128})  # fmt: skip
    print(report_line("openhands-v1", "hello finish", run))
    assert_plumbing(run, R.FINISH)
    state = v1_state(tmp_path)
    assert state["execution_status"] == "finished"
    assert state["max_iterations"] == 3 and state["agent"].get("condenser") is None
    assert state["agent"]["llm"]["temperature"] == 0.6 and state["agent"]["llm"]["max_output_tokens"] == 128


class ClosedSession(OpenHandsScaffold):
    """The V1 CLI pointed at a session the gateway does not hold: every LLM call answers 404."""

    def env(self, ctx):
        env = super().env(ctx)
        return {**env, "LLM_BASE_URL": re.sub(r"/s/[^/]+/", "/s/s-closed/", env["LLM_BASE_URL"])}


async def test_v1_error_when_its_endpoint_fails(
    real_gateway: str, v1: OpenHandsScaffold, tmp_path: Path
) -> None:
    agent = ClosedSession(version="v1", venv=v1.venv)
    run = await run_real(real_gateway, agent, TASKS["count"], tmp_path, max_turns=3, agent_timeout_s=300)
    print(report_line("openhands-v1", "count error", run))
    r = run.result
    assert r.failed_stage is None and r.termination is R.ERROR, (r.error, r.detail, r.output_tail[-2000:])
    assert "NotFound" in r.detail or "404" in r.detail, r.detail
    assert r.reward == UNSOLVED_REWARD and run.samples == 0 and run.leftovers == []


async def test_v1_timeout(real_gateway: str, v1: OpenHandsScaffold, tmp_path: Path) -> None:
    # Far shorter than the CLI's own start-up (imports alone take longer): killed before its first call.
    run = await run_real(real_gateway, v1, TASKS["fix-add"], tmp_path, max_turns=50, agent_timeout_s=5)
    print(report_line("openhands-v1", "fix-add timeout", run))
    r = run.result
    assert r.failed_stage is None and r.termination is R.TIMEOUT, (r.error, r.output_tail[-2000:])
    assert r.reward == UNSOLVED_REWARD and run.leftovers == []


async def test_v0_max_turns(real_gateway: str, v0: OpenHandsScaffold, tmp_path: Path) -> None:
    run = await run_real(real_gateway, v0, TASKS["count"], tmp_path, max_turns=2, agent_timeout_s=400,
                         sampling={"temperature": 0.6, "max_tokens": 128})  # fmt: skip
    print(report_line("openhands-v0", "count max_turns", run))
    assert_plumbing(run, R.MAX_TURNS, min_calls=2)


async def test_v0_timeout(real_gateway: str, v0: OpenHandsScaffold, tmp_path: Path) -> None:
    # V0 samples at temperature 0.0 unless told otherwise; the tiny model then repeats itself and
    # OpenHands' loop detector ends the run as `stuck` (three equal agent messages in a row) before
    # the limit. Sampling varies the replies, yet at temperature 1.0 the tiny model still copies
    # itself now and then (once in CI after 41 calls; twice in a row in another CI run, after 21
    # and 20): such a run is checked as the `stuck` it is, and the timeout is tried again, up
    # to three runs in all. The turn limit is far past what 30 s holds, and so is the context: a
    # quiet machine made 100 calls in 69 s, and its context overflowed past 100 calls (at 150 s
    # those two ended the run first). V0 starts in about 10 s: the run is killed mid-loop.
    for attempt in range(3):
        (work := tmp_path / str(attempt)).mkdir()
        sampling = {"temperature": 1.0, "max_tokens": 128}
        run = await run_real(real_gateway, v0, TASKS["hello"], work, max_turns=1000, agent_timeout_s=30,
                             sampling=sampling)  # fmt: skip
        print(report_line("openhands-v0", "hello timeout", run))
        if run.result.termination is not R.STUCK:
            break
        assert_plumbing(run, R.STUCK)
    assert_plumbing(run, R.TIMEOUT)
