"""GitHub Copilot CLI (`@github/copilot` on npm) as an installed scaffold.

Runs `copilot -p TASK --yolo --output-format json` in the workspace on a custom provider
("bring your own key"): `COPILOT_PROVIDER_BASE_URL` is the session's base URL, its key in
`COPILOT_PROVIDER_API_KEY`, `COPILOT_PROVIDER_TYPE=openai` with `COPILOT_PROVIDER_WIRE_API`
`completions` (the scaffold's `wire_api`, or `responses`), and `COPILOT_OFFLINE=true`: no
GitHub sign-in, telemetry, web tools, GitHub MCP server or update checks (no internet in a
sandbox). Its state lives in a directory of the scaffold's own (`COPILOT_HOME`). A
`max_tokens` in the run's sampling becomes `COPILOT_PROVIDER_MAX_OUTPUT_TOKENS`, the
`context_window` option `COPILOT_PROVIDER_MAX_PROMPT_TOKENS` (else Copilot assumes 128000).
Copilot documents no switch for its history compaction (near the prompt limit) nor a turn
limit in prompt mode: `max_turns` is not passed, the run's wall-clock limit bounds it.

Termination, from the JSON events: the final `result` event's `exitCode`; a `session.error`
(a request that failed after Copilot's retries) is `error`, `context_length_exceeded` when its
message says the context overflowed; a clean `result` is `finish`. With no `result` the base
rules apply.
"""

from __future__ import annotations

from typing import Any, Literal

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

WireApi = Literal["completions", "responses"]


class CopilotScaffold(NodeCliScaffold):
    """GitHub Copilot CLI headless (`copilot -p`), pinned `version` of `@github/copilot`."""

    name = "copilot"
    package = "@github/copilot"
    binary = "copilot"
    default_version = "1.0.102"

    def __init__(self, *, version: str | None = None, prefix: str | None = None,
                 wire_api: WireApi = "completions", context_window: int | None = None):  # fmt: skip
        super().__init__(version=version, prefix=prefix)
        if wire_api not in ("completions", "responses"):
            raise ValueError(f"copilot wire_api must be completions or responses, not {wire_api!r}")
        self.wire_api = wire_api
        self.context_window = context_window

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        # `-p` takes the task as its value: the task is appended last.
        return [self.executable, "--yolo", "--output-format", "json", "--no-auto-update", "-p"]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "COPILOT_HOME": f"{ctx.home}/copilot-home",
            "COPILOT_OFFLINE": "true",
            "COPILOT_AUTO_UPDATE": "false",
            "COPILOT_PROVIDER_BASE_URL": ctx.llm.base_url,
            "COPILOT_PROVIDER_API_KEY": ctx.llm.api_key,
            "COPILOT_PROVIDER_TYPE": "openai",
            "COPILOT_PROVIDER_WIRE_API": self.wire_api,
            "COPILOT_MODEL": ctx.llm.model,
        }
        if max_tokens := output_cap(ctx):
            env["COPILOT_PROVIDER_MAX_OUTPUT_TOKENS"] = str(max_tokens)
        if self.context_window:
            env["COPILOT_PROVIDER_MAX_PROMPT_TOKENS"] = str(self.context_window)
        return env

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        info.turns = sum(1 for e in events if e.get("type") == "assistant.turn_start")
        errors = [
            str((e.get("data") or {}).get("message") or "")
            for e in events
            if e.get("type") == "session.error"
        ]
        results = [e for e in events if e.get("type") == "result"]
        if errors:
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if CONTEXT_ERROR.search(errors[-1]) else R.ERROR)
            info.detail = errors[-1][:500]
        elif results:
            code = results[-1].get("exitCode")
            info.signals.add(R.FINISH if code == 0 else R.ERROR)
            info.detail = f"exitCode={code}"
        elif CONTEXT_ERROR.search(stderr):
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
        return info
