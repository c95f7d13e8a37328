"""`InstalledScaffold`: what the runner needs to know about one agent CLI.

A scaffold is shell commands in, files out: the files and commands that install it, the
command line and environment that run it against an OpenAI-compatible endpoint, where its
logs are, how to read its trajectory into termination signals, and which of its history
settings must be forced append-only when tokens are captured. It knows nothing about the
sandbox backend, the gateway or the per-task lifecycle (that is `agent.InstalledAgent`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rlgw.scaffolds.tasks import Task
from rlgw.scaffolds.termination import TerminationReason, classify

Mode = Literal["capture", "eval"]


class CaptureConflictError(ValueError):
    """The scaffold was configured to rewrite its history (summarize, condense, truncate) while capturing."""


@dataclass(frozen=True, slots=True)
class LLMEndpoint:
    """The OpenAI-compatible endpoint the agent talks to (a gateway session, or the engine in eval)."""

    base_url: str
    api_key: str
    model: str


@dataclass(frozen=True, slots=True)
class ScaffoldContext:
    """Everything a scaffold needs to build its commands for one task run.

    `home` is the scaffold's own directory inside the sandbox (install and logs), under the
    sandbox's scratch area so it never lands in the frozen workspace. `sampling` holds the
    run's sampling parameters (OpenAI names: temperature, top_p, max_tokens, ...), which each
    scaffold passes through its own settings, since some agents send their own defaults on
    every call (OpenHands V0 sends `temperature: 0.0`).
    """

    task: Task
    mode: Mode
    llm: LLMEndpoint
    workdir: str
    home: str
    max_turns: int
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TrajectoryInfo:
    """What a scaffold's logs say about the run: turn count, termination signals, a detail line."""

    turns: int = 0
    signals: set[TerminationReason] = field(default_factory=set)
    detail: str = ""


class InstalledScaffold(abc.ABC):
    """Base of every scaffold: one concrete class per agent CLI.

    Subclasses set `name` and implement the abstract methods; `check_mode` raises
    `CaptureConflictError` when the user's history settings contradict capture, and the
    command builders then force append-only settings in capture mode and leave the user's
    settings alone in eval mode.
    """

    name: ClassVar[str]

    def check_mode(self, mode: Mode) -> None:  # noqa: B027 (default: nothing to check)
        """Raise `CaptureConflictError` if this configuration cannot run in `mode`."""

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        """Files (sandbox path -> text) written before the install commands run."""
        return {}

    @abc.abstractmethod
    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        """Shell commands, run in order; any non-zero exit fails the install."""

    @abc.abstractmethod
    def run_command(self, ctx: ScaffoldContext) -> str:
        """The one shell command that runs the agent on `ctx.task`."""

    @abc.abstractmethod
    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        """Environment of the run command (the LLM endpoint goes here)."""

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        """Log files to capture after the run: name -> sandbox path (missing ones are skipped)."""
        return {}

    @abc.abstractmethod
    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        """Read the captured logs and the run's output into turns and termination signals."""

    def termination_reason(
        self, *, infra_error: bool, timed_out: bool, exit_code: int | None, trajectory: TrajectoryInfo
    ) -> TerminationReason:
        """The run's reason by the shared precedence (`termination.classify`)."""
        return classify(
            infra_error=infra_error, timed_out=timed_out, exit_code=exit_code, signals=trajectory.signals
        )
