"""System messages in the middle of a conversation, placed where the served template can put them.

Claude Code sends `{"role": "system"}` turns inside `messages` (its agent-types listing, later
reminders). A template that renders a system message at any position (Qwen3's and ChatML's
do) gets it there, verbatim. A template that cannot (it raises, or drops the message) gets
what Anthropic's own fallback does: the text moves into a ``<system-reminder>`` block of the
adjacent user turn (the next one, else the one before, else a user turn of its own), joined to
that turn's text with "\\n" as text blocks are. Which applies is probed once per template.

The first message of a conversation is the system prompt and is left alone. This module knows
nothing about HTTP or the ledger; it rewrites chat messages before they are rendered, the same
way on every request, so the ledger sees one stable history.
"""

from __future__ import annotations

import functools
from typing import Any

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import ChatRenderer, TemplateIncompatible

_MARK = "rlgw-mid-system-probe"
_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
    {"role": "system", "content": _MARK},
    {"role": "user", "content": "v"},
]


@functools.cache
def places_mid_system(renderer: ChatRenderer) -> bool:
    """Whether the template renders a system message that comes after other messages."""
    try:
        return _MARK in renderer.render_text(_PROBE, None, add_generation_prompt=True)
    except (InvalidRequest, TemplateIncompatible):
        return False


def reminder(text: str) -> str:
    """`text` as Claude Code wraps a system message it cannot send as one."""
    return f"<system-reminder>\n{text}\n</system-reminder>"


def fold_mid_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with every system message after the first position moved into a user turn."""
    if not any(m.get("role") == "system" for m in messages[1:]):
        return messages
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # reminders waiting for the next user turn
    for i, m in enumerate(messages):
        if i == 0 or m.get("role") != "system":
            if pending and m.get("role") == "user":
                m = {**m, "content": "\n".join([*pending, m.get("content") or ""])}
                pending = []
            out.append(m)
            continue
        text = reminder(m.get("content") or "")
        if _next_user(messages, i):
            pending.append(text)
        elif out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": "\n".join([out[-1].get("content") or "", text])}
        else:
            out.append({"role": "user", "content": text})
    return out


def _next_user(messages: list[dict[str, Any]], i: int) -> bool:
    """Whether the next message that is not a system message is a user turn."""
    for m in messages[i + 1 :]:
        if m.get("role") != "system":
            return m.get("role") == "user"
    return False
