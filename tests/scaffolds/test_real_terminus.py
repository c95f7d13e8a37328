"""Terminus-2 (harbor 0.26.0 from PyPI) run for real on the local sandbox against a capture session.

Forced endings: `max_turns` (a turn budget the tiny model uses up), `timeout` (a wall-clock
limit shorter than the turn budget needs), `context_length_exceeded` (an instruction longer
than the model's context). Two runs at once also prove each run has its own tmux server.
"""

from __future__ import annotations

import asyncio
import glob
from pathlib import Path

import pytest

from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.termination import TerminationReason as R
from rlgw.scaffolds.terminus import IMPORTS, Terminus2Scaffold
from tests.support.agent_venvs import locked_venv
from tests.support.real_runs import (
    TASKS,
    UNSOLVED_REWARD,
    assert_plumbing,
    overflowing,
    report_line,
    run_real,
)

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]


@pytest.fixture(scope="module")
def terminus() -> Terminus2Scaffold:
    venv = locked_venv("terminus-harbor", lock_for("harbor", "0.26.0"), IMPORTS)
    return Terminus2Scaffold(venv=str(venv))


async def test_max_turns_on_two_tasks_at_once(real_gateway: str, terminus: Terminus2Scaffold,
                                              tmp_path: Path) -> None:  # fmt: skip
    runs = await asyncio.gather(
        run_real(real_gateway, terminus, TASKS["hello"], tmp_path / "a", max_turns=2, agent_timeout_s=240,
                 sampling={"temperature": 0.7, "max_tokens": 96}),
        run_real(real_gateway, terminus, TASKS["count"], tmp_path / "b", max_turns=2, agent_timeout_s=240,
                 sampling={"temperature": 0.7, "max_tokens": 96}),
    )  # fmt: skip
    for name, run in zip(("hello", "count"), runs, strict=True):
        print(report_line("terminus-2", f"{name} max_turns", run))
        assert_plumbing(run, R.MAX_TURNS, min_calls=2)
    assert not glob.glob("/tmp/rlgw-tmux-*"), "a run's tmux directory was left behind"


async def test_timeout(real_gateway: str, terminus: Terminus2Scaffold, tmp_path: Path) -> None:
    task = TASKS["fix-add"]
    run = await run_real(real_gateway, terminus, task, tmp_path, max_turns=200, agent_timeout_s=25,
                         sampling={"max_tokens": 96})  # fmt: skip
    print(report_line("terminus-2", "fix-add timeout", run))
    assert_plumbing(run, R.TIMEOUT)


async def test_context_length_exceeded(
    real_gateway: str, terminus: Terminus2Scaffold, tmp_path: Path
) -> None:
    run = await run_real(real_gateway, terminus, overflowing(TASKS["count"]), tmp_path, max_turns=3,
                         agent_timeout_s=240)  # fmt: skip
    print(report_line("terminus-2", "count context", run))
    r = run.result
    assert r.failed_stage is None and r.termination is R.CONTEXT_LENGTH_EXCEEDED, (
        r.error,
        r.output_tail[-2000:],
    )
    assert r.reward == UNSOLVED_REWARD and run.leftovers == []
