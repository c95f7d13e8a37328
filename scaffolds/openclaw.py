"""OpenClaw (`openclaw` on npm) as an installed scaffold, on Node 24 from npm.

Runs `openclaw agent exec --config openclaw.json --json --model rlgw/M TASK` in the workspace: OpenClaw's
isolated headless turn (its documented entry point for CI: no Gateway daemon, a temporary state directory
removed afterwards, the `coding` tool profile, tools scoped to the workspace), against exactly the config file
rlgw writes (`--config`: nothing from the user's own config). That file declares a custom provider `rlgw`
(`models.providers.rlgw`: `api: openai-completions`, `baseUrl` the session's URL, `apiKey` the session key,
the model `M`; `models.mode: replace`, so no bundled provider is tried) and makes `rlgw/M` the default model;
a `max_tokens` in the run's sampling becomes the model's `maxTokens` (OpenClaw's default is 8192). Update
checks and feature statistics are off (`update.checkOnStart: false`, `OPENCLAW_NO_AUTO_UPDATE=1`).

History: capture turns proactive compaction off (`agents.defaults.compaction.enabled: false`; OpenClaw still
compacts once and retries when the endpoint reports a context overflow, which nothing turns off) and keeps
tool result pruning off (`contextPruning.mode: off`, already its default for a non-Anthropic provider); eval
keeps OpenClaw's defaults. OpenClaw has no turn limit: `max_turns` is not passed, and its own deadline is
set past any run (`--timeout`), so the run's wall-clock limit bounds it.

Termination: the JSON envelope `--json` prints on stdout (one pretty-printed object): `status: ok` is
`finish`; an `error` whose `kind` is `context_overflow` (or whose message names one) is
`context_length_exceeded`, any other `error` or `timeout` is `error`; `assistantTurns` counts the model
calls. Without an envelope the base rules apply (exit 0 `finish`, else `error`). This module knows nothing
about sandboxes or the gateway.
"""

from __future__ import annotations

from typing import Any

import orjson

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

PROVIDER = "rlgw"
# Past any run's wall-clock limit: OpenClaw's own deadline (600 s by default) never ends a run first.
NO_DEADLINE_S = 7 * 24 * 3600


class OpenClawScaffold(NodeCliScaffold):
    """OpenClaw headless (`openclaw agent exec --json`), pinned `version` of `openclaw`, on Node 24."""

    name = "openclaw"
    package = "openclaw"
    binary = "openclaw"
    default_version = "2026.9.6"
    default_node_version = "24.22.3"  # it wants Node >= 24.16 (< 25)

    def config(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """OpenClaw's config file for this run."""
        model: dict[str, Any] = {"id": ctx.llm.model, "name": ctx.llm.model, "input": ["text"]}
        if max_tokens := output_cap(ctx):
            model["maxTokens"] = max_tokens
        provider = {"baseUrl": ctx.llm.base_url, "apiKey": ctx.llm.api_key, "api": "openai-completions",
                    "models": [model]}  # fmt: skip
        defaults: dict[str, Any] = {"model": {"primary": f"{PROVIDER}/{ctx.llm.model}"}}
        if ctx.mode == "capture":
            defaults |= {"compaction": {"enabled": False}, "contextPruning": {"mode": "off"}}
        return {
            "models": {"mode": "replace", "providers": {PROVIDER: provider}},
            "agents": {"defaults": defaults},
            "update": {"checkOnStart": False},
        }

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        config = orjson.dumps(self.config(ctx), option=orjson.OPT_INDENT_2).decode()
        return {**super().install_files(ctx), f"{ctx.home}/openclaw.json": config}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [
            self.executable, "agent", "exec", "--config", f"{ctx.home}/openclaw.json", "--json",
            "--model", f"{PROVIDER}/{ctx.llm.model}", "--timeout", str(NO_DEADLINE_S),
        ]  # fmt: skip

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"OPENCLAW_NO_AUTO_UPDATE": "1"}  # no update requests or statistics (no internet in a sandbox)

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        try:
            envelope = orjson.loads(logs.get("events") or b"")
        except orjson.JSONDecodeError:
            envelope = None
        events = [envelope] if isinstance(envelope, dict) else []
        return self.parse_events(
            events, logs.get("stderr", b"").decode(errors="replace"), exit_code, ctx.max_turns
        )

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        if not events:
            return info
        envelope = events[-1]
        info.turns = int(envelope.get("assistantTurns") or 0)
        status = str(envelope.get("status"))
        error = envelope.get("error") if isinstance(envelope.get("error"), dict) else {}
        kind, message = str(error.get("kind") or ""), str(error.get("message") or "")
        if status == "ok":
            info.signals.add(R.FINISH)
        elif kind == "context_overflow" or CONTEXT_ERROR.search(message):
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
        else:
            info.signals.add(R.ERROR)
        info.detail = f"status={status}" + (f" {kind}: {message[:300]}" if error else "")
        return info
