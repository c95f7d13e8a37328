"""Termination reasons: how a scaffold run ended, one classifier, and the failure-class summary.

Precedence (first match wins; a scaffold only supplies the *agent signals* it found in its
logs, the order below is fixed here):

| rank | reason                    | when                                                          |
| ---- | ------------------------- | ------------------------------------------------------------- |
| 1    | `infra_error`             | the sandbox, install, gateway or verifier failed              |
| 2    | `timeout`                 | the agent ran past its wall-clock limit and was killed        |
| 3    | `finish` / `reject`       | the agent ended the task itself (finish beats reject)         |
| 4    | `context_length_exceeded` | the conversation no longer fit the model                      |
| 5    | `max_turns` / `budget`    | the agent's turn (iteration) or cost budget ran out           |
| 6    | `stuck`                   | the scaffold detected a loop and stopped                      |
| 7    | `error`                   | any other agent failure                                       |

With no agent signal at all, exit code 0 means `finish` and anything else `error`.
Each reason maps to a `SampleStatus` for the samples of that run (`status_for`).
This module knows nothing about sandboxes or scaffold log formats.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable

from rlgw.gateway.sample import SampleStatus


class TerminationReason(enum.StrEnum):
    """How one run ended (see the module table for precedence)."""

    INFRA_ERROR = "infra_error"
    TIMEOUT = "timeout"
    FINISH = "finish"
    REJECT = "reject"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MAX_TURNS = "max_turns"
    BUDGET = "budget"
    STUCK = "stuck"
    ERROR = "error"


# The order agent signals are resolved in (infra_error and timeout come from the runner).
AGENT_PRECEDENCE: tuple[TerminationReason, ...] = (
    TerminationReason.FINISH,
    TerminationReason.REJECT,
    TerminationReason.CONTEXT_LENGTH_EXCEEDED,
    TerminationReason.MAX_TURNS,
    TerminationReason.BUDGET,
    TerminationReason.STUCK,
    TerminationReason.ERROR,
)

_STATUS = {
    TerminationReason.FINISH: SampleStatus.COMPLETED,
    TerminationReason.REJECT: SampleStatus.COMPLETED,
    TerminationReason.CONTEXT_LENGTH_EXCEEDED: SampleStatus.TRUNCATED,
    TerminationReason.MAX_TURNS: SampleStatus.TRUNCATED,
    TerminationReason.BUDGET: SampleStatus.TRUNCATED,
    # Stopped from outside the agent: the tokens are real, the episode is incomplete.
    TerminationReason.TIMEOUT: SampleStatus.ABORTED,
    TerminationReason.STUCK: SampleStatus.ABORTED,
    TerminationReason.ERROR: SampleStatus.FAILED,
    TerminationReason.INFRA_ERROR: SampleStatus.FAILED,
}


def classify(
    *,
    infra_error: bool,
    timed_out: bool,
    exit_code: int | None,
    signals: Iterable[TerminationReason] = (),
) -> TerminationReason:
    """The one termination reason of a run, by the module's precedence table."""
    if infra_error:
        return TerminationReason.INFRA_ERROR
    if timed_out:
        return TerminationReason.TIMEOUT
    found = set(signals)
    for reason in AGENT_PRECEDENCE:
        if reason in found:
            return reason
    return TerminationReason.FINISH if exit_code == 0 else TerminationReason.ERROR


def status_for(reason: TerminationReason) -> SampleStatus:
    """The `SampleStatus` the samples of a run with this ending get."""
    return _STATUS[reason]


def failure_classes(reasons: Iterable[TerminationReason | str]) -> dict[str, int]:
    """Count of runs per termination reason, in precedence order, zero counts left out."""
    counts = Counter(str(r) for r in reasons)
    order = [str(TerminationReason.INFRA_ERROR), str(TerminationReason.TIMEOUT)] + [
        str(r) for r in AGENT_PRECEDENCE
    ]
    return {name: counts[name] for name in order if counts[name]}
