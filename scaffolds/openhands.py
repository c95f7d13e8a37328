"""OpenHands as an installed scaffold: the pinned V0 headless entry and the V1 CLI.

V0 (`python -m openhands.core.main -t TASK --config-file FILE`) reads the LLM from
`LLM_BASE_URL` / `LLM_MODEL` / `LLM_API_KEY` (`LLM_NATIVE_TOOL_CALLING=true`) and saves its
event list to `SAVE_TRAJECTORY_PATH`. When capturing, its config file pins the `noop`
condenser and turns history truncation off; a user-chosen condenser or truncation then
raises `CaptureConflictError`. In eval those settings are left to the user.

V1 (`openhands --headless --json -t TASK`) prints one JSON event per line on stdout; the
same LLM variables apply; capture pins `OPENHANDS_CONDENSER=noop` likewise.

OpenHands' exit code says little (it exits 0 after an error state), so the run is read
from its events: the last agent state (finished / rejected / error / stuck) and, for
errors, `last_error` text (max iterations, budget, stuck in a loop, context window).
This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import orjson

from rlgw.scaffolds.scaffold import (
    CaptureConflictError,
    InstalledScaffold,
    Mode,
    ScaffoldContext,
    TrajectoryInfo,
)
from rlgw.scaffolds.termination import TerminationReason

# uv installs itself into ~/.local/bin.
UV_PATH = 'export PATH="$HOME/.local/bin:$PATH";'
# `last_error` / error-event text -> reason, checked in this order.
_ERROR_PATTERNS: tuple[tuple[re.Pattern[str], TerminationReason], ...] = (
    (re.compile(r"context ?window|context length|ContextWindowExceeded|LLMContextWindowExceed", re.I),
     TerminationReason.CONTEXT_LENGTH_EXCEEDED),
    (re.compile(r"maximum (number of )?iteration|max(imum)? ?iterations? (reached|exceeded)", re.I),
     TerminationReason.MAX_TURNS),
    (re.compile(r"budget", re.I), TerminationReason.BUDGET),
    (re.compile(r"stuck", re.I), TerminationReason.STUCK),
)  # fmt: skip


def classify_error_text(text: str) -> TerminationReason:
    """Map an OpenHands error message to a reason (plain `error` when nothing matches)."""
    for pattern, reason in _ERROR_PATTERNS:
        if pattern.search(text):
            return reason
    return TerminationReason.ERROR


def _state_signal(state: str, error_text: str) -> TerminationReason | None:
    state = state.lower()
    if state == "finished":
        return TerminationReason.FINISH
    if state == "rejected":
        return TerminationReason.REJECT
    if state == "stuck":
        return TerminationReason.STUCK
    if state == "error":
        return classify_error_text(error_text)
    return None


class OpenHandsScaffold(InstalledScaffold):
    """OpenHands V0 headless (`version="v0"`, pinned `openhands_version`) or the V1 CLI (`version="v1"`).

    `condenser` and `history_truncation` are the user's history settings: None means
    "not set" (capture pins them append-only; eval leaves OpenHands' defaults).
    """

    name = "openhands"

    def __init__(
        self,
        *,
        version: str = "v0",
        openhands_version: str = "0.59.0",
        condenser: str | None = None,
        history_truncation: bool | None = None,
        venv: str = "/opt/openhands-venv",
        native_tool_calling: bool = True,
    ):
        if version not in ("v0", "v1"):
            raise ValueError(f"OpenHands version must be 'v0' or 'v1', not {version!r}")
        self.version = version
        self.openhands_version = openhands_version
        self.condenser = condenser
        self.history_truncation = history_truncation
        self.venv = venv
        self.native_tool_calling = native_tool_calling

    def check_mode(self, mode: Mode) -> None:
        if mode != "capture":
            return
        if self.condenser not in (None, "noop"):
            raise CaptureConflictError(
                f"OpenHands condenser {self.condenser!r} rewrites history; capture needs 'noop' or unset"
            )
        if self.history_truncation:
            raise CaptureConflictError("OpenHands history truncation rewrites history; capture needs it off")

    def _history_settings(self, mode: Mode) -> tuple[str | None, bool | None]:
        if mode == "capture":
            return "noop", False
        return self.condenser, self.history_truncation

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        if self.version == "v1":
            return {f"{ctx.home}/instruction.md": ctx.task.instruction}
        condenser, truncation = self._history_settings(ctx.mode)
        lines = ["[core]", f'workspace_base = "{ctx.workdir}"', "", "[agent]"]
        if truncation is not None:
            lines.append(f"enable_history_truncation = {'true' if truncation else 'false'}")
        if condenser is not None:
            lines += ["", "[condenser]", f'type = "{condenser}"']
        return {
            f"{ctx.home}/config.toml": "\n".join(lines) + "\n",
            f"{ctx.home}/instruction.md": ctx.task.instruction,
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        venv = shlex.quote(self.venv)
        if self.version == "v0":
            pkg, check = (
                f"openhands-ai=={self.openhands_version}",
                f"{venv}/bin/python -m openhands.core.main --version",
            )
        else:
            pkg, check = "openhands", f"{venv}/bin/openhands --version"
        return [
            "command -v uv >/dev/null || (curl -LsSf https://astral.sh/uv/install.sh | sh)",
            f"{UV_PATH} test -x {venv}/bin/python || uv venv {venv} --python 3.12",
            f"{UV_PATH} uv pip install --python {venv}/bin/python {shlex.quote(pkg)}",
            check,
        ]

    def run_command(self, ctx: ScaffoldContext) -> str:
        task = f"$(cat {shlex.quote(ctx.home + '/instruction.md')})"
        if self.version == "v0":
            return (
                f'{shlex.quote(self.venv)}/bin/python -m openhands.core.main -t "{task}" '
                f"--config-file {shlex.quote(ctx.home + '/config.toml')} -d {shlex.quote(ctx.workdir)} "
                f"-i {ctx.max_turns} "
                f"2>&1 </dev/null | tee {shlex.quote(ctx.home + '/openhands.log')}; exit ${{PIPESTATUS[0]}}"
            )
        return (
            f'{shlex.quote(self.venv)}/bin/openhands --headless --json -t "{task}" '
            f"</dev/null | tee {shlex.quote(ctx.home + '/events.jsonl')}; exit ${{PIPESTATUS[0]}}"
        )

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "LLM_BASE_URL": ctx.llm.base_url,
            "LLM_MODEL": f"openai/{ctx.llm.model}",  # LiteLLM provider prefix: a plain OpenAI-compatible API
            "LLM_API_KEY": ctx.llm.api_key,
            "LLM_NATIVE_TOOL_CALLING": "true" if self.native_tool_calling else "false",
            "MAX_ITERATIONS": str(ctx.max_turns),
            "RUNTIME": "local",
            "SANDBOX_VOLUMES": f"{ctx.workdir}:/workspace:rw",
            "RUN_AS_OPENHANDS": "false",
            "SKIP_DEPENDENCY_CHECK": "1",
            "AGENT_ENABLE_BROWSING": "false",
            "ENABLE_BROWSER": "false",
            "AGENT_ENABLE_PROMPT_EXTENSIONS": "false",
            "FILE_STORE": "local",
            "FILE_STORE_PATH": f"{ctx.home}/file_store",
        }
        if self.version == "v0":
            env["SAVE_TRAJECTORY_PATH"] = f"{ctx.home}/trajectory.json"
        else:
            condenser, _ = self._history_settings(ctx.mode)
            if condenser is not None:
                env["OPENHANDS_CONDENSER"] = condenser
        return env

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        if self.version == "v0":
            return {"trajectory": f"{ctx.home}/trajectory.json", "log": f"{ctx.home}/openhands.log"}
        return {"events": f"{ctx.home}/events.jsonl"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        if self.version == "v0":
            return parse_v0_events(
                _load_v0(logs.get("trajectory")), logs.get("log", b"").decode(errors="replace")
            )
        text = logs.get("events", b"").decode(errors="replace") or output
        return parse_v1_events(_jsonl(text))


def _load_v0(raw: bytes | None) -> list[dict[str, Any]]:
    if not raw:
        return []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return doc if isinstance(doc, list) else list(doc.get("history") or doc.get("events") or [])


def _jsonl(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return events


def parse_v0_events(events: list[dict[str, Any]], log_text: str = "") -> TrajectoryInfo:
    """V0 event list: the last `agent_state_changed` state, with `reason` / error text for errors.

    Without a state change (the trajectory was never saved) the console log's last
    `last_error`-style line is the evidence, if any.
    """
    info = TrajectoryInfo()
    state, error_text = "", ""
    for ev in events:
        if ev.get("source") == "agent" and ev.get("action") not in (
            None,
            "message",
            "system",
            "change_agent_state",
        ):
            info.turns += 1
        if ev.get("observation") == "agent_state_changed":
            extras = ev.get("extras") or {}
            state = str(extras.get("agent_state", ""))
            if extras.get("reason"):
                error_text = str(extras["reason"])
        elif ev.get("observation") == "error":
            error_text = str(ev.get("content") or ev.get("message") or error_text)
        elif ev.get("action") == "finish":
            state = state or "finished"
    if not state and log_text:
        # No saved trajectory: the console's last "to AgentState.X" transition and error line.
        transitions = re.findall(r"to AgentState\.(\w+)", log_text)
        state = transitions[-1].lower() if transitions else ""
        errors = [ln for ln in log_text.splitlines() if ":ERROR:" in ln]
        error_text = errors[-1] if errors else ""
    if (sig := _state_signal(state, error_text)) is not None:
        info.signals.add(sig)
    info.detail = error_text
    return info


def parse_v1_events(events: list[dict[str, Any]]) -> TrajectoryInfo:
    """V1 JSON events: `ConversationStateUpdateEvent` execution_status, `FinishAction`, error events."""
    info = TrajectoryInfo()
    status, error_text, finished = "", "", False
    for ev in events:
        kind = ev.get("kind", "")
        if kind == "ActionEvent":
            info.turns += 1
            if (ev.get("action") or {}).get("kind") == "FinishAction":
                finished = True
        elif kind == "ConversationStateUpdateEvent" and ev.get("key") == "execution_status":
            status = str(ev.get("value", ""))
        elif kind in ("AgentErrorEvent", "ConversationErrorEvent"):
            error_text = str(ev.get("error") or ev.get("detail") or ev.get("code") or "")
    if status == "finished" and not finished and error_text:
        status = "error"
    if (sig := _state_signal(status, error_text)) is not None:
        info.signals.add(sig)
    elif error_text:
        info.signals.add(classify_error_text(error_text))
    info.detail = error_text
    return info
