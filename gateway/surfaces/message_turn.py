"""The checks every message surface's turn needs, whichever wire format it came in.

Chat Completions, Anthropic Messages and OpenAI Responses each validate their request once, in
their own wire model, and translate it straight into `turns/messages.py`'s `ChatParams`. What
holds for the internal turn whatever the surface (a conversation to answer, a `tool_choice`
that the tools can honour, template kwargs the renderer does not set itself) is checked here,
once, with the same 400s on every surface. This module knows no surface's shapes.
"""

from __future__ import annotations

from typing import Any

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import check_template_kwargs
from rlgw.gateway.turns.messages import ChatDelta, ChatParams

TOOL_CHOICES = ("auto", "none", "required")


def check_tool_choice(tools: list[dict[str, Any]] | None, choice: Any) -> None:
    """400 for a `tool_choice` (in the internal, OpenAI-style form) that `tools` cannot honour."""
    if isinstance(choice, str) and choice not in TOOL_CHOICES:
        raise InvalidRequest("tool_choice must be 'auto', 'none', 'required' or a named function")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in {t["function"]["name"] for t in tools or []}:
            raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    if choice not in (None, "none", "auto") and not tools:
        raise InvalidRequest(f"tool_choice={choice!r} needs tools", param="tool_choice")


def checked(params: ChatParams) -> ChatParams:
    """`params` of a translated request, once what every message turn needs holds (400s)."""
    if not params.messages:
        raise InvalidRequest("the request holds no message to answer", param="messages")
    check_tool_choice(params.tools, params.tool_choice)
    check_template_kwargs(params.template_kwargs)
    return params


def call_arguments(delta: ChatDelta) -> str:
    """The text of a tool call's arguments a streamed delta carries: all of them for a whole call,
    a piece for `tool_call_args`, none for `tool_call_start` (they follow) or text."""
    if delta.kind == "tool_call_args":
        return delta.text
    return delta.call.arguments if delta.kind == "tool_call" and delta.call is not None else ""
