"""opencode (`opencode-ai` on npm) as an installed scaffold.

Runs `opencode run --format json TASK` in the workspace with `OPENCODE_CONFIG` pointing at a
config file of the scaffold's own: one provider, `rlgw`, on `@ai-sdk/openai-compatible`
with the session's base URL and key (Chat Completions), the model `rlgw/<model>`, the build
agent's `steps` set to `max_turns`, auto-update and sharing off. The model's `limit` is the
run's `max_tokens` (sampling) and the `context_window` option: without a `max_tokens`,
opencode asks for 32000 output tokens, which a model with a smaller context refuses. The models.dev catalogue
fetch is off (`OPENCODE_DISABLE_MODELS_FETCH`: no internet in a sandbox). Capture turns
auto-compaction and tool-output pruning off (`OPENCODE_DISABLE_AUTOCOMPACT`,
`OPENCODE_DISABLE_PRUNE`: both rewrite the history); eval keeps opencode's defaults.
Sampling is the session's (opencode sends its own per-model defaults).

Termination, from the JSON events: an `error` event that says the context overflowed is
`context_length_exceeded`, any other `error` is `error`; a last `step_finish` with reason
`tool-calls` (steps ran out mid-task) is `max_turns` when all `max_turns` steps ran; a
clean exit otherwise defers to the base rules (`finish`).
"""

from __future__ import annotations

from typing import Any

import orjson

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R


class OpencodeScaffold(NodeCliScaffold):
    """opencode headless (`opencode run`), pinned `version` of `opencode-ai`."""

    name = "opencode"
    package = "opencode-ai"
    binary = "opencode"
    default_version = "1.18.33"
    config_file = "opencode.json"

    def __init__(self, *, version: str | None = None, prefix: str | None = None,
                 context_window: int | None = None):  # fmt: skip
        super().__init__(version=version, prefix=prefix)
        self.context_window = context_window

    def config(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """opencode's config document for this run."""
        model: dict[str, Any] = {"name": ctx.llm.model}
        output = output_cap(ctx)
        if output or self.context_window:
            # 0 is opencode's "unknown": no compaction check, and its own output cap (32000).
            model["limit"] = {"context": self.context_window or 0, "output": output or 0}
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "rlgw": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "rlgw",
                    "options": {"baseURL": ctx.llm.base_url, "apiKey": ctx.llm.api_key},
                    "models": {ctx.llm.model: model},
                }
            },
            "model": f"rlgw/{ctx.llm.model}",
            "agent": {"build": {"steps": ctx.max_turns}},
            "autoupdate": False,
            "share": "disabled",
        }

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        config = orjson.dumps(self.config(ctx), option=orjson.OPT_INDENT_2).decode()
        return {**super().install_files(ctx), f"{ctx.home}/{self.config_file}": config}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [self.executable, "run", "--format", "json"]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "OPENCODE_CONFIG": f"{ctx.home}/{self.config_file}",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }
        if ctx.mode == "capture":
            env.update({"OPENCODE_DISABLE_AUTOCOMPACT": "1", "OPENCODE_DISABLE_PRUNE": "1"})
        return env

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        steps = [e for e in events if e.get("type") == "step_finish"]
        info.turns = len(steps)
        errors = [orjson.dumps(e.get("error") or e).decode() for e in events if e.get("type") == "error"]
        if errors:
            overflow = any(CONTEXT_ERROR.search(m) for m in errors)
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if overflow else R.ERROR)
            info.detail = errors[-1][:500]
            return info
        last = (steps[-1].get("part") or {}).get("reason") if steps else None
        if last == "tool-calls" and info.turns >= max_turns:
            info.signals.add(R.MAX_TURNS)
        elif CONTEXT_ERROR.search(stderr) and exit_code != 0:
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
        return info
