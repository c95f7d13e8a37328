"""Claude Code (`@anthropic-ai/claude-code` on npm) as an installed scaffold.

Runs `claude -p TASK --output-format stream-json --verbose --dangerously-skip-permissions
--max-turns N --model MODEL` in the workspace, pointed at the session's Anthropic Messages
surface (`ANTHROPIC_BASE_URL=.../s/<id>`, the session key in `ANTHROPIC_API_KEY`), its
settings in a config directory of its own (`CLAUDE_CONFIG_DIR`), telemetry, update checks
and error reports off (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`: there is no internet in
a sandbox). `IS_SANDBOX=1` lets it skip permission prompts as root. A `max_tokens` in the
run's sampling becomes `CLAUDE_CODE_MAX_OUTPUT_TOKENS`; every other sampling value is the
session's (Claude Code has no setting for them). Capture turns auto-compaction off
(`DISABLE_AUTO_COMPACT=1`: a compaction rewrites the history); eval keeps Claude Code's default.

Termination: the stream's final `result` event names why its query loop ended
(`terminal_reason`, and `subtype` for the limits): `completed` is `finish`, `max_turns` is
`max_turns`, `prompt_too_long` / `blocking_limit` are `context_length_exceeded`,
`budget_exhausted` is `budget`, `rapid_refill_breaker` (a loop breaker) is `stuck`, and an
API, model or tool failure is `error`. With no result event the base rules apply.
"""

from __future__ import annotations

from typing import Any

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap, session_root
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

# `terminal_reason` (Claude Code 2.1's result event) -> rlgw's reason; unlisted ones are `error`.
_TERMINAL = {
    "completed": R.FINISH,
    "max_turns": R.MAX_TURNS,
    "prompt_too_long": R.CONTEXT_LENGTH_EXCEEDED,
    "blocking_limit": R.CONTEXT_LENGTH_EXCEEDED,
    "budget_exhausted": R.BUDGET,
    "rapid_refill_breaker": R.STUCK,
}
_SUBTYPE = {"error_max_turns": R.MAX_TURNS, "error_max_budget_usd": R.BUDGET}


class ClaudeCodeScaffold(NodeCliScaffold):
    """Claude Code headless (`claude -p`), pinned `version` of `@anthropic-ai/claude-code`."""

    name = "claude-code"
    package = "@anthropic-ai/claude-code"
    binary = "claude"
    default_version = "2.1.332"

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [
            self.executable, "-p", "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions", "--max-turns", str(ctx.max_turns), "--model", ctx.llm.model,
        ]  # fmt: skip

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": session_root(ctx.llm.base_url),
            "ANTHROPIC_API_KEY": ctx.llm.api_key,
            "CLAUDE_CONFIG_DIR": f"{ctx.home}/config",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "IS_SANDBOX": "1",
        }
        if ctx.mode == "capture":
            env["DISABLE_AUTO_COMPACT"] = "1"
        if max_tokens := output_cap(ctx):
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_tokens)
        return env

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        results = [e for e in events if e.get("type") == "result"]
        if not results:
            if CONTEXT_ERROR.search(stderr):
                info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
            return info
        result = results[-1]
        info.turns = int(result.get("num_turns") or 0)
        terminal, subtype = result.get("terminal_reason"), result.get("subtype")
        reason = _SUBTYPE.get(str(subtype)) or _TERMINAL.get(str(terminal))
        if reason is None or (reason is R.FINISH and result.get("is_error")):
            text = str(result.get("result") or "")
            reason = R.CONTEXT_LENGTH_EXCEEDED if CONTEXT_ERROR.search(text) else R.ERROR
        info.signals.add(reason)
        info.detail = f"terminal_reason={terminal} subtype={subtype}: {str(result.get('result') or '')[:300]}"
        return info
