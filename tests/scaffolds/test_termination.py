"""The shared precedence table and the status mapping."""

from __future__ import annotations

import pytest

from rlgw.gateway.sample import SampleStatus
from rlgw.scaffolds.termination import TerminationReason as R
from rlgw.scaffolds.termination import classify, failure_classes, status_for

ALL_AGENT = {R.FINISH, R.REJECT, R.CONTEXT_LENGTH_EXCEEDED, R.MAX_TURNS, R.BUDGET, R.STUCK, R.ERROR}


@pytest.mark.parametrize(
    ("infra", "timed_out", "exit_code", "signals", "expected"),
    [
        (True, True, 0, ALL_AGENT, R.INFRA_ERROR),  # infra beats everything
        (False, True, None, ALL_AGENT, R.TIMEOUT),  # timeout beats the agent's own signals
        (False, False, 1, ALL_AGENT, R.FINISH),
        (False, False, 0, ALL_AGENT - {R.FINISH}, R.REJECT),
        (
            False,
            False,
            0,
            {R.CONTEXT_LENGTH_EXCEEDED, R.MAX_TURNS, R.STUCK, R.ERROR},
            R.CONTEXT_LENGTH_EXCEEDED,
        ),
        (False, False, 0, {R.MAX_TURNS, R.BUDGET, R.STUCK}, R.MAX_TURNS),
        (False, False, 0, {R.BUDGET, R.STUCK, R.ERROR}, R.BUDGET),
        (False, False, 0, {R.STUCK, R.ERROR}, R.STUCK),
        (False, False, 0, {R.ERROR}, R.ERROR),
        (False, False, 0, set(), R.FINISH),  # no evidence: the exit code decides
        (False, False, 2, set(), R.ERROR),
        (False, False, None, set(), R.ERROR),
    ],
)
def test_precedence(infra, timed_out, exit_code, signals, expected) -> None:
    assert classify(infra_error=infra, timed_out=timed_out, exit_code=exit_code, signals=signals) is expected


def test_status_mapping_covers_every_reason() -> None:
    assert {r: status_for(r) for r in R} == {
        R.FINISH: SampleStatus.COMPLETED, R.REJECT: SampleStatus.COMPLETED,
        R.CONTEXT_LENGTH_EXCEEDED: SampleStatus.TRUNCATED, R.MAX_TURNS: SampleStatus.TRUNCATED,
        R.BUDGET: SampleStatus.TRUNCATED, R.TIMEOUT: SampleStatus.ABORTED, R.STUCK: SampleStatus.ABORTED,
        R.ERROR: SampleStatus.FAILED, R.INFRA_ERROR: SampleStatus.FAILED,
    }  # fmt: skip


def test_failure_classes_in_precedence_order() -> None:
    counts = failure_classes([R.ERROR, R.FINISH, "finish", R.INFRA_ERROR, R.TIMEOUT, R.TIMEOUT])
    assert list(counts.items()) == [("infra_error", 1), ("timeout", 2), ("finish", 2), ("error", 1)]
