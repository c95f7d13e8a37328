"""Gemini CLI (`@google/gemini-cli` on npm) as an installed scaffold.

Runs `gemini --yolo --output-format stream-json --model MODEL --prompt TASK` in the workspace,
pointed at the session's Gemini surface (`GOOGLE_GEMINI_BASE_URL` = the session's root,
`{gateway}/s/{session}`; the CLI appends `/v1beta/models/MODEL:streamGenerateContent`; the
session key in `GEMINI_API_KEY`, sent as `x-goog-api-key`), its settings and state in a home of
its own (`GEMINI_CLI_HOME`): the API-key auth selected in `settings.json`
(`security.auth.selectedType: gemini-api-key`; 0.61.0 derives a `gateway` auth type from
`GOOGLE_GEMINI_BASE_URL` that its own headless check then refuses as "Invalid auth method
selected"), the workspace trusted (`GEMINI_CLI_TRUST_WORKSPACE`: an untrusted folder turns
`--yolo` back into asking), telemetry, usage statistics and update checks off (no internet in
a sandbox). `max_turns` is `model.maxSessionTurns`. Capture sets `model.compressionThreshold`
to 1.0 (compress only when the context is full; the default 0.5 rewrites the history
halfway), eval keeps Gemini CLI's default. The next-speaker check is off by default in this
release (`model.skipNextSpeakerCheck`), so a run's requests are its main conversation.

Sampling: Gemini CLI sends `temperature: 1, topP: 0.95, topK: 64` and `thinkingConfig:
{includeThoughts: true}`; in a capture session the session's sampling wins.

Termination: the stream's final `result` event: `success` is `finish`; an `error` result says
why in its message (Gemini CLI's "Reached max session turns" is `max_turns`, a context overflow
`context_length_exceeded`, anything else `error`). With no result event, exit code 53 (Gemini
CLI's turn-limit exit) is `max_turns`; otherwise the base rules apply.
"""

from __future__ import annotations

from typing import Any

import orjson

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, session_root
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

MAX_TURNS_TEXT = "max session turns"
TURN_LIMIT_EXIT = 53  # FatalTurnLimitedError's exit code


class GeminiCliScaffold(NodeCliScaffold):
    """Gemini CLI headless (`gemini --prompt TASK`), pinned `version` of `@google/gemini-cli`."""

    name = "gemini-cli"
    package = "@google/gemini-cli"
    binary = "gemini"
    default_version = "0.61.0"

    def settings(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """Gemini CLI's `settings.json` for this run."""
        model: dict[str, Any] = {"maxSessionTurns": ctx.max_turns}
        if ctx.mode == "capture":
            model["compressionThreshold"] = 1.0
        return {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "model": model,
        }

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        settings = orjson.dumps(self.settings(ctx), option=orjson.OPT_INDENT_2).decode()
        return {**super().install_files(ctx), f"{ctx.home}/gemini-home/.gemini/settings.json": settings}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [
            self.executable, "--yolo", "--output-format", "stream-json", "--model", ctx.llm.model, "--prompt",
        ]  # fmt: skip

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "GOOGLE_GEMINI_BASE_URL": session_root(ctx.llm.base_url),
            "GEMINI_API_KEY": ctx.llm.api_key,
            "GEMINI_CLI_HOME": f"{ctx.home}/gemini-home",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo(turns=sum(1 for e in events if e.get("type") == "tool_use"))
        results = [e for e in events if e.get("type") == "result"]
        if not results:
            if exit_code == TURN_LIMIT_EXIT or MAX_TURNS_TEXT in stderr:
                info.signals.add(R.MAX_TURNS)
            elif CONTEXT_ERROR.search(stderr):
                info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
            return info
        result = results[-1]
        error = result.get("error")
        message = str(error.get("message") or "") if isinstance(error, dict) else ""
        if result.get("status") == "success":
            info.signals.add(R.FINISH)
        elif MAX_TURNS_TEXT in message or exit_code == TURN_LIMIT_EXIT:
            info.signals.add(R.MAX_TURNS)
        else:
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if CONTEXT_ERROR.search(message) else R.ERROR)
        info.detail = f"status={result.get('status')}: {message[:300]}"
        return info
