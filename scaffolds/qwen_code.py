"""qwen-code (`@qwen-code/qwen-code` on npm) as an installed scaffold.

Runs `qwen --output-format stream-json --approval-mode yolo --auth-type openai
--max-session-turns N --model MODEL TASK` in the workspace, pointed at the session's Chat
Completions surface (`OPENAI_BASE_URL`, the session key in `OPENAI_API_KEY`), its settings
and state in a directory of its own (`QWEN_HOME`): telemetry, usage statistics and update
checks off (there is no internet in a sandbox). A `max_tokens` in the run's sampling becomes
`QWEN_CODE_MAX_OUTPUT_TOKENS`; other sampling values are the session's. A compaction rewrites the
history: capture compacts only at a full context (`context.autoCompactThreshold: 1`; 0.24 has no
switch to turn it off) and never clears old tool results (`context.clearContextOnIdle`'s triggers
-1), and for 0.15 turns chat compression off (`model.chatCompression.contextPercentageThreshold:
0`); eval keeps qwen-code's defaults.

The pin is 0.24.4, which wants Node.js 22 or later (0.15.10 was the last on Node 20): the scaffold
runs it on Node 24 from npm (`default_node_version`), installed into the CLI's prefix first.

Termination: the stream's final `result` event: `success` is `finish`, unless flagged
`is_error` or its text is qwen-code's `[API Error: ...]` (a refused request ends the run with
exit 0 and a `success` result); those and `error_during_execution` say why in their message (a
context overflow is `context_length_exceeded`, anything else `error`). With no result event,
qwen-code's "Reached max session turns" on stderr is `max_turns`, an overflow message
`context_length_exceeded`; otherwise the base rules apply.
"""

from __future__ import annotations

from typing import Any

import orjson

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

MAX_TURNS_TEXT = "Reached max session turns"
API_ERROR = "[API Error"


class QwenCodeScaffold(NodeCliScaffold):
    """qwen-code headless (`qwen TASK`), pinned `version` of `@qwen-code/qwen-code`."""

    name = "qwen-code"
    package = "@qwen-code/qwen-code"
    binary = "qwen"
    default_version = "0.24.4"
    default_node_version = "24.22.3"

    def settings(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """qwen-code's `settings.json` for this run."""
        settings: dict[str, Any] = {
            "general": {"disableAutoUpdate": True},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        if ctx.mode == "capture":
            # 0.24 has no switch that turns compaction off: it compacts only at a full context, and never
            # clears old tool results. 0.15's switch (0: never compress), which 0.24 ignores, stays for
            # a run pinned to 0.15.
            settings["context"] = {
                "autoCompactThreshold": 1.0,
                "clearContextOnIdle": {
                    "toolResultsThresholdMinutes": -1,
                    "toolResultsTotalCharsThreshold": -1,
                },
            }
            settings["model"] = {"chatCompression": {"contextPercentageThreshold": 0}}
        return settings

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        settings = orjson.dumps(self.settings(ctx), option=orjson.OPT_INDENT_2).decode()
        return {**super().install_files(ctx), f"{ctx.home}/qwen-home/settings.json": settings}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [
            self.executable, "--output-format", "stream-json", "--approval-mode", "yolo",
            "--auth-type", "openai", "--max-session-turns", str(ctx.max_turns), "--model", ctx.llm.model,
        ]  # fmt: skip

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "OPENAI_BASE_URL": ctx.llm.base_url,
            "OPENAI_API_KEY": ctx.llm.api_key,
            "OPENAI_MODEL": ctx.llm.model,
            "QWEN_HOME": f"{ctx.home}/qwen-home",
        }
        if max_tokens := output_cap(ctx):
            env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(max_tokens)
        return env

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        results = [e for e in events if e.get("type") == "result"]
        if not results:
            if MAX_TURNS_TEXT in stderr:
                info.signals.add(R.MAX_TURNS)
            elif CONTEXT_ERROR.search(stderr):
                info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
            return info
        result = results[-1]
        info.turns = int(result.get("num_turns") or 0)
        error = result.get("error")
        message = str((error or {}).get("message") if isinstance(error, dict) else result.get("result") or "")
        failed = message.startswith(API_ERROR)  # qwen-code reports an API failure as a `success`
        if result.get("subtype") == "success" and not result.get("is_error") and not failed:
            info.signals.add(R.FINISH)
        elif MAX_TURNS_TEXT in message:
            info.signals.add(R.MAX_TURNS)
        else:
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if CONTEXT_ERROR.search(message) else R.ERROR)
        info.detail = f"subtype={result.get('subtype')}: {message[:300]}"
        return info
