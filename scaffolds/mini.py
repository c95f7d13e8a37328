"""The `rlgw-mini` scaffold: the built-in one-tool agent (`in_sandbox/mini_agent.py`), installed in seconds.

Install copies the agent script into the sandbox and makes sure `openai` imports there;
run points it at the endpoint through OPENAI_BASE_URL / OPENAI_API_KEY. Its JSONL log's
last event names how it ended. It has no history-rewriting setting, so capture needs nothing
forced. This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import shlex

import orjson

from rlgw.scaffolds.in_sandbox import IN_SANDBOX
from rlgw.scaffolds.scaffold import InstalledScaffold, ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason

AGENT_SOURCE = IN_SANDBOX / "mini_agent.py"
_EVENT_SIGNALS = {
    "finish": TerminationReason.FINISH,
    "max_turns": TerminationReason.MAX_TURNS,
    "context_length_exceeded": TerminationReason.CONTEXT_LENGTH_EXCEEDED,
    "error": TerminationReason.ERROR,
}


class MiniScaffold(InstalledScaffold):
    """rlgw-mini. `python` is the interpreter inside the sandbox; `max_tokens` caps each reply."""

    name = "rlgw-mini"

    def __init__(self, *, python: str = "python3", max_tokens: int = 512, command_timeout_s: float = 60.0):
        self.python = python
        self.max_tokens = max_tokens
        self.command_timeout_s = command_timeout_s

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            f"{ctx.home}/agent.py": AGENT_SOURCE.read_text(),
            f"{ctx.home}/instruction.md": ctx.task.instruction,
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        py = shlex.quote(self.python)
        # find_spec, not import: importing openai costs seconds on a busy machine.
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('openai') is None)"
        return [f"{py} -c {shlex.quote(probe)} || {py} -m pip install --quiet 'openai>=1.40'"]

    def run_command(self, ctx: ScaffoldContext) -> str:
        args = [
            self.python, f"{ctx.home}/agent.py",
            "--instruction-file", f"{ctx.home}/instruction.md",
            "--model", ctx.llm.model,
            "--max-turns", str(ctx.max_turns),
            "--max-tokens", str(self.max_tokens),
            "--command-timeout", str(self.command_timeout_s),
            "--log", f"{ctx.home}/trajectory.jsonl",
        ]  # fmt: skip
        return shlex.join(args)

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": ctx.llm.base_url,
            "OPENAI_API_KEY": ctx.llm.api_key,
            "PYTHONUNBUFFERED": "1",
        }

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"trajectory": f"{ctx.home}/trajectory.jsonl"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        last: dict | None = None
        for line in logs.get("trajectory", b"").splitlines():
            try:
                ev = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line cut by a kill is not evidence of anything
            if ev.get("event") == "turn":
                info.turns = max(info.turns, int(ev.get("turn", 0)))
            if ev.get("event") in _EVENT_SIGNALS:
                last = ev
        if last is not None:
            info.signals.add(_EVENT_SIGNALS[last["event"]])
            info.detail = str(last.get("detail") or "")
        return info
