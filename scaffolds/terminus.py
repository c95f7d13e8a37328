"""Terminus-2 (harbor / terminal-bench) as an installed scaffold.

Installs `harbor` (Python >= 3.12) and tmux in the sandbox (nothing when the venv already
imports Terminus-2) and runs `in_sandbox/terminus_launcher.py` there, pointed at the endpoint (LiteLLM's
`openai/` provider, `OPENAI_API_KEY`), each run with its own tmux server, the run's sampling
passed through Terminus-2's own settings.
Capture forces `enable_summarize` off (a user who turned it on gets
`CaptureConflictError`); eval passes the user's choice (default on, harbor's default).

Termination: on a clean exit, a `mark_task_complete` tool call in the ATIF trajectory is
`finish`; else `max_turns` when the agent used its whole turn budget; else `finish`.
A context-length failure in the output is `context_length_exceeded`. A non-zero exit
defers to the base rules (`error`). This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import re
import shlex

import orjson

from rlgw.scaffolds.in_sandbox import IN_SANDBOX
from rlgw.scaffolds.install import lock_install
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.scaffold import (
    CaptureConflictError,
    InstalledScaffold,
    Mode,
    ScaffoldContext,
    TrajectoryInfo,
)
from rlgw.scaffolds.termination import TerminationReason

LAUNCHER_SOURCE = IN_SANDBOX / "terminus_launcher.py"
# What the launcher imports, checked once harbor's lock is installed.
IMPORTS = ("harbor.agents.terminus_2.terminus_2", "harbor.environments.base", "harbor.models.agent.context")
_CONTEXT = re.compile(r"ContextLengthExceededError|context length exceeded|context_length_exceeded", re.I)


class Terminus2Scaffold(InstalledScaffold):
    """Terminus-2. `enable_summarize`: None = unset (capture forces off; eval uses harbor's default on)."""

    name = "terminus-2"

    def __init__(self, *, harbor_version: str = "0.26.0", enable_summarize: bool | None = None,
                 venv: str = "/opt/terminus-venv"):  # fmt: skip
        self.harbor_version = harbor_version
        self.enable_summarize = enable_summarize
        self.venv = venv

    def check_mode(self, mode: Mode) -> None:
        if mode == "capture" and self.enable_summarize:
            raise CaptureConflictError(
                "Terminus-2 summarization rewrites history; capture needs enable_summarize off"
            )

    def _summarize(self, mode: Mode) -> bool:
        if mode == "capture":
            return False
        return True if self.enable_summarize is None else self.enable_summarize

    def _install(self, ctx: ScaffoldContext) -> tuple[dict[str, str], str]:
        return lock_install(self.venv, lock_for("harbor", self.harbor_version), ctx.home, IMPORTS)

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            f"{ctx.home}/launcher.py": LAUNCHER_SOURCE.read_text(),
            f"{ctx.home}/instruction.md": ctx.task.instruction,
            **self._install(ctx)[0],
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        return [
            "command -v tmux >/dev/null || (apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux)",
            self._install(ctx)[1],
        ]

    def run_command(self, ctx: ScaffoldContext) -> str:
        args = [
            f"{self.venv}/bin/python", f"{ctx.home}/launcher.py",
            "--instruction-file", f"{ctx.home}/instruction.md",
            "--model", f"openai/{ctx.llm.model}",
            "--api-base", ctx.llm.base_url,
            "--max-turns", str(ctx.max_turns),
            "--enable-summarize", "true" if self._summarize(ctx.mode) else "false",
            "--logs-dir", f"{ctx.home}/logs",
            "--workdir", ctx.workdir,
            "--sampling", orjson.dumps(ctx.sampling).decode(),
        ]  # fmt: skip
        tee = shlex.quote(ctx.home + "/terminus.log")
        return f"{shlex.join(args)} 2>&1 | tee {tee}; exit ${{PIPESTATUS[0]}}"

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": ctx.llm.api_key,
            "OPENAI_API_BASE": ctx.llm.base_url,
            "PYTHONUNBUFFERED": "1",
            # LiteLLM otherwise fetches its price list from GitHub at start (8 s of retries offline).
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"trajectory": f"{ctx.home}/logs/trajectory.json", "log": f"{ctx.home}/terminus.log"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        text = logs.get("log", b"").decode(errors="replace") + output
        return parse_terminus_trajectory(logs.get("trajectory"), text, exit_code, ctx.max_turns)


def parse_terminus_trajectory(
    raw: bytes | None, log_text: str, exit_code: int | None, max_turns: int | None
) -> TrajectoryInfo:
    """ATIF trajectory + console text -> turns and the Terminus-2 termination signal."""
    info = TrajectoryInfo()
    steps: list[dict] = []
    if raw:
        try:
            doc = orjson.loads(raw)
            steps = list(doc.get("steps") or []) if isinstance(doc, dict) else []
        except orjson.JSONDecodeError:
            steps = []
    agent_steps = [s for s in steps if s.get("source") == "agent"]
    info.turns = len(agent_steps)
    completed = any(
        (tc or {}).get("function_name") == "mark_task_complete"
        for s in agent_steps
        for tc in s.get("tool_calls") or []
    )
    if _CONTEXT.search(log_text):
        info.signals.add(TerminationReason.CONTEXT_LENGTH_EXCEEDED)
        info.detail = "context length exceeded"
    if exit_code != 0:
        return info  # non-zero exits defer to the base rules
    if completed:
        info.signals.add(TerminationReason.FINISH)
    elif max_turns is not None and info.turns >= max_turns:
        info.signals.add(TerminationReason.MAX_TURNS)
    elif not info.signals:
        info.signals.add(TerminationReason.FINISH)
    return info
