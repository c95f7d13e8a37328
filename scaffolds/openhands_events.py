"""Reading how an OpenHands run ended, from what OpenHands itself wrote.

V0 (`openhands-ai` 0.59): the saved trajectory (`state.history`) leaves out
`agent_state_changed`, so the evidence is the event files OpenHands persists under its file
store (`sessions/<sid>/events/<n>.json`, merged into one list by the run command), which do
carry `agent_state_changed` with its `reason`; the console log (ANSI-coloured:
`openhands:ERROR\\x1b[0m:`) is the fallback.

V1 (the `openhands` 1.16 CLI): the JSONL events it prints with `--json` plus the
conversation's own persisted state (`base_state.json`: `execution_status`, `max_iterations`,
the agent and its condenser). The CLI emits no `ConversationStateUpdateEvent`; a
`FinishAction` is the agent's finish, a `ConversationErrorEvent` ends the run (e.g.
`MaxIterationsReached`), and an `AgentErrorEvent` (a bad tool call) is recoverable: it is
reported to the model and the run goes on, so it decides nothing by itself.

This module knows nothing about sandboxes, the gateway or command lines.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from rlgw.scaffolds.scaffold import TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# `last_error` / error-event text -> reason, checked in this order.
_ERROR_PATTERNS: tuple[tuple[re.Pattern[str], TerminationReason], ...] = (
    (re.compile(r"context ?window|context length|ContextWindowExceeded|LLMContextWindowExceed", re.I),
     TerminationReason.CONTEXT_LENGTH_EXCEEDED),
    (re.compile(r"maximum (number of )?iteration|max(imum)? ?iterations? (reached|exceeded)", re.I),
     TerminationReason.MAX_TURNS),
    (re.compile(r"budget", re.I), TerminationReason.BUDGET),
    (re.compile(r"stuck", re.I), TerminationReason.STUCK),
)  # fmt: skip


def strip_ansi(text: str) -> str:
    """`text` without terminal colour and cursor codes."""
    return _ANSI.sub("", text)


def classify_error_text(text: str) -> TerminationReason:
    """Map an OpenHands error message to a reason (plain `error` when nothing matches)."""
    for pattern, reason in _ERROR_PATTERNS:
        if pattern.search(text):
            return reason
    return TerminationReason.ERROR


def _state_signal(state: str, error_text: str) -> TerminationReason | None:
    state = state.lower().rsplit(".", 1)[-1]  # "AgentState.FINISHED" or "finished"
    if state == "finished":
        return TerminationReason.FINISH
    if state == "rejected":
        return TerminationReason.REJECT
    if state == "stuck":
        return TerminationReason.STUCK
    if state == "error":
        return classify_error_text(error_text)
    return None


def load_json_list(raw: bytes | None) -> list[dict[str, Any]]:
    """A JSON list of events (or a `{history|events: [...]}` document); [] if unreadable."""
    if not raw:
        return []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return doc if isinstance(doc, list) else list(doc.get("history") or doc.get("events") or [])


def load_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects among `text`'s lines (the CLI prints other lines too)."""
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
    """V0 events: the last `agent_state_changed` state, with its `reason` / error text for errors.

    Without a state change in the events, the console log's last `to AgentState.X`
    transition and its last ERROR line (colour codes removed) are the evidence, if any.
    """
    info = TrajectoryInfo()
    state, error_text = "", ""
    for ev in events:
        if ev.get("source") == "agent" and ev.get("action") not in (
            None,
            "message",
            "system",
            "change_agent_state",
            "recall",
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
        clean = strip_ansi(log_text)
        transitions = re.findall(r"to AgentState\.(\w+)", clean)
        state = transitions[-1].lower() if transitions else ""
        errors = [ln for ln in clean.splitlines() if ":ERROR:" in ln]
        error_text = errors[-1] if errors else ""
    if (sig := _state_signal(state, error_text)) is not None:
        info.signals.add(sig)
    info.detail = error_text
    return info


def parse_v1_events(events: list[dict[str, Any]], state: dict[str, Any] | None = None) -> TrajectoryInfo:
    """V1 CLI events (+ the conversation's `base_state.json`) -> turns and the ending signal.

    Precedence: a `FinishAction` is `finish`; else the persisted `execution_status` (an error
    classified by the last `ConversationErrorEvent`); else a `ConversationStateUpdateEvent`
    status (older builds). `AgentErrorEvent`s only show up in `detail`.
    """
    info = TrajectoryInfo()
    status, fatal, recoverable, finished = "", "", "", False
    for ev in events:
        kind = ev.get("kind", "")
        if kind == "ActionEvent":
            info.turns += 1
            if (ev.get("action") or {}).get("kind") == "FinishAction":
                finished = True
        elif kind == "ConversationStateUpdateEvent" and ev.get("key") == "execution_status":
            status = str(ev.get("value", ""))
        elif kind == "ConversationErrorEvent":
            fatal = " ".join(str(ev.get(k) or "") for k in ("code", "detail")).strip()
        elif kind == "AgentErrorEvent":
            recoverable = str(ev.get("error") or "")
    if state and state.get("execution_status"):
        status = str(state["execution_status"])
    if finished:
        info.signals.add(TerminationReason.FINISH)
    elif (sig := _state_signal(status, fatal)) is not None:
        info.signals.add(sig)
    elif fatal:
        info.signals.add(classify_error_text(fatal))
    info.detail = fatal or (f"recovered from: {recoverable}" if recoverable else "")
    return info


def v1_settings(state: dict[str, Any] | None) -> dict[str, Any]:
    """What the run's own state says about its history settings: max_iterations and condenser kind."""
    if not state:
        return {}
    condenser = (state.get("agent") or {}).get("condenser")
    return {
        "max_iterations": state.get("max_iterations"),
        "condenser": condenser.get("kind") if isinstance(condenser, dict) else condenser,
    }
