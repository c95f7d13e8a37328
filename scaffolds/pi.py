"""pi (`@mariozechner/pi-coding-agent` on npm) as an installed scaffold.

Runs `pi -p --mode json --provider rlgw --model MODEL TASK` in the workspace with its config
directory (`PI_CODING_AGENT_DIR`) in the scaffold's own: a `models.json` whose one provider,
`rlgw`, is the session (`baseUrl` and the key, read from `RLGW_SESSION_KEY`) on the API the
scaffold's `api` names: `openai-completions` (Chat, the default), `openai-responses` or
`anthropic-messages`. The model's `maxTokens` is the run's `max_tokens` (sampling; else pi's
default, 16384) and its `contextWindow` the `context_window` option (else pi's default,
128000). Startup network calls and install telemetry are off (`PI_OFFLINE`, `PI_TELEMETRY`:
no internet in a sandbox). Capture turns auto-compaction off (`compaction.enabled: false` in
`settings.json`: a compaction rewrites the history); eval keeps pi's default. pi has no
turn limit of its own: `max_turns` is not passed (the run's wall-clock limit bounds it).
Sampling is the session's.

Termination, from the JSON events: the last assistant message's `stopReason`: `stop` is
`finish`; `length` (cut at the output cap, no answer), `error` or `aborted` is `error`
(`context_length_exceeded` when its `errorMessage` says the context overflowed). With no
assistant message the base rules apply.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap, session_root
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

PiApi = Literal["openai-completions", "openai-responses", "anthropic-messages"]
_APIS = ("openai-completions", "openai-responses", "anthropic-messages")
# A reply cut at its output cap (`length`) ends pi's loop without an answer: an error, like a failure.
_STOP = {"stop": R.FINISH, "length": R.ERROR, "error": R.ERROR, "aborted": R.ERROR}


class PiScaffold(NodeCliScaffold):
    """pi headless (`pi -p --mode json`), pinned `version` of `@mariozechner/pi-coding-agent`."""

    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    binary = "pi"
    default_version = "0.73.1"

    def __init__(self, *, version: str | None = None, prefix: str | None = None,
                 api: PiApi = "openai-completions", context_window: int | None = None):  # fmt: skip
        super().__init__(version=version, prefix=prefix)
        if api not in _APIS:
            raise ValueError(f"pi api must be one of {', '.join(_APIS)}, not {api!r}")
        self.api = api
        self.context_window = context_window

    def models(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """pi's `models.json` for this run."""
        model: dict[str, Any] = {"id": ctx.llm.model}
        if output := output_cap(ctx):
            model["maxTokens"] = output
        if self.context_window:
            model["contextWindow"] = self.context_window
        # Anthropic's SDK appends `/v1/messages` to its base URL.
        base = session_root(ctx.llm.base_url) if self.api == "anthropic-messages" else ctx.llm.base_url
        provider = {"baseUrl": base, "api": self.api, "apiKey": "RLGW_SESSION_KEY", "models": [model]}
        return {"providers": {"rlgw": provider}}

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        settings = {"compaction": {"enabled": False}} if ctx.mode == "capture" else {}
        return {
            **super().install_files(ctx),
            f"{ctx.home}/pi-agent/models.json": orjson.dumps(self.models(ctx)).decode(),
            f"{ctx.home}/pi-agent/settings.json": orjson.dumps(settings).decode(),
        }

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [self.executable, "-p", "--mode", "json", "--provider", "rlgw", "--model", ctx.llm.model]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "PI_CODING_AGENT_DIR": f"{ctx.home}/pi-agent",
            "RLGW_SESSION_KEY": ctx.llm.api_key,
            "PI_OFFLINE": "1",
            "PI_TELEMETRY": "0",
        }

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        info.turns = sum(1 for e in events if e.get("type") == "turn_start")
        replies = [
            e["message"]
            for e in events
            if e.get("type") == "message_end" and (e.get("message") or {}).get("role") == "assistant"
        ]
        if not replies:
            if CONTEXT_ERROR.search(stderr):
                info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
            return info
        last = replies[-1]
        stop, error = str(last.get("stopReason")), str(last.get("errorMessage") or "")
        reason = _STOP.get(stop)
        if reason is R.ERROR and CONTEXT_ERROR.search(error):
            reason = R.CONTEXT_LENGTH_EXCEEDED
        if reason is not None:
            info.signals.add(reason)
        info.detail = f"stopReason={stop}: {error[:300]}"
        return info
