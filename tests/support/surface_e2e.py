"""Helpers for the Messages and Responses end-to-end tests, on top of the harness in `tests/support/e2e.py`.

`e2e.check_sample` checks a stored sample against `Run.requests` (the conversation in chat
messages, as the template renders it) and `Run.replies` (objects shaped like the openai SDK's
assistant message). These helpers turn other SDKs' replies into that shape and give the tool
results the fixture was trained on.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support import fixture_prompts as fp
from tests.support.e2e import StreamedMessage, _Call, _Fn


def chat_reply(content: str, reasoning: str | None, calls: list[tuple[str, str, str]]) -> StreamedMessage:
    """A reply as `check_sample` reads it: text, reasoning and (id, name, arguments) calls."""
    return StreamedMessage(
        content, reasoning or None, [_Call(cid, _Fn(name, args)) for cid, name, args in calls]
    )


def result_text(name: str, arguments: dict[str, Any]) -> str:
    """What the fixture's tools return (the conversations it was trained on)."""
    if name == "get_weather":
        return fp.weather_result(arguments.get("city", "?"), "sunny", 20)
    return json.dumps({"files": ["a.txt", "b.txt"]})
