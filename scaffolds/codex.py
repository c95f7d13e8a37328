"""Codex CLI (`@openai/codex` on npm) as an installed scaffold.

Runs `codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox
TASK` in the workspace (rlgw's sandbox is the sandbox; Codex's own needs kernel features a
container may lack), with `CODEX_HOME` in the scaffold's directory holding a `config.toml`
whose one model provider is the session: `base_url` the session's, `wire_api =
"responses"` (Codex 0.17x accepts nothing else), the key read from `RLGW_SESSION_KEY`.
Codex has no setting for sampling or an output cap (it sends no `max_output_tokens`): the
session's sampling applies. Capture sets `model_auto_compact_token_limit` past any context (a compaction
rewrites the history); eval keeps Codex's default. Codex has no turn limit of its own:
`max_turns` is not passed (the run's wall-clock limit bounds it).

Termination, from the `--json` events: a `turn.failed` or `error` event whose message says
the context overflowed is `context_length_exceeded`, any other is `error`; a
`turn.completed` with no failure is `finish`. With no events the base rules apply.
"""

from __future__ import annotations

import json
from typing import Any

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

# Far past any context window: auto-compaction never triggers.
NO_COMPACTION = 1 << 62


class CodexScaffold(NodeCliScaffold):
    """Codex headless (`codex exec`), pinned `version` of `@openai/codex`."""

    name = "codex"
    package = "@openai/codex"
    binary = "codex"
    default_version = "0.171.0"

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        # TOML basic strings take JSON's escapes for the characters a URL or a model name can hold.
        lines = [
            f"model = {json.dumps(ctx.llm.model)}",
            'model_provider = "rlgw"',
        ]
        if ctx.mode == "capture":
            lines.append(f"model_auto_compact_token_limit = {NO_COMPACTION}")
        lines += [
            "",
            "[model_providers.rlgw]",
            'name = "rlgw"',
            f"base_url = {json.dumps(ctx.llm.base_url)}",
            'env_key = "RLGW_SESSION_KEY"',
            'wire_api = "responses"',
        ]
        return {**super().install_files(ctx), f"{ctx.home}/codex-home/config.toml": "\n".join(lines) + "\n"}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [self.executable, "exec", "--json", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox"]  # fmt: skip

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"CODEX_HOME": f"{ctx.home}/codex-home", "RLGW_SESSION_KEY": ctx.llm.api_key}

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        info.turns = sum(1 for e in events if e.get("type") == "turn.started")
        failures = [_message(e) for e in events if e.get("type") in ("turn.failed", "error")]
        if failures:
            overflow = any(CONTEXT_ERROR.search(m) for m in failures)
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if overflow else R.ERROR)
            info.detail = failures[-1][:500]
        elif any(e.get("type") == "turn.completed" for e in events):
            info.signals.add(R.FINISH)
        elif CONTEXT_ERROR.search(stderr):
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
        return info


def _message(event: dict[str, Any]) -> str:
    error = event.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or "")
    return str(event.get("message") or "")
