"""A ChatCompletion and its ChatCompletionChunks, shaped as `gateway/turns/messages.py` yields them.

Shared by the translation tests of the Messages and Responses surfaces: one turn that reasons,
answers and calls two tools, so a stream translation can be checked against the non-streamed
translation of the same turn.
"""

from __future__ import annotations

from typing import Any

ID = "chatcmpl-0123abcd"
MODEL = "tiny"
CALLS = [("call_aaa", "get_weather", '{"city": "Paris"}'), ("call_bbb", "get_weather", '{"city": "Tokyo"}')]
USAGE = {
    "prompt_tokens": 50,
    "completion_tokens": 20,
    "total_tokens": 70,
    "prompt_tokens_details": {"cached_tokens": 8},
}


def completion(
    finish_reason: str = "tool_calls", matched_stop: Any = None, calls: bool = True
) -> dict[str, Any]:
    """The non-streamed ChatCompletion of the turn."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "Two cities.",
    }
    if calls:
        message["tool_calls"] = [
            {"id": cid, "index": i, "type": "function", "function": {"name": name, "arguments": args}}
            for i, (cid, name, args) in enumerate(CALLS)
        ]
    choice = {"index": 0, "message": message, "finish_reason": finish_reason, "matched_stop": matched_stop}
    return {
        "id": ID,
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [choice],
        "usage": USAGE,
    }


def _chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
    return {"id": ID, "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": [choice]}


def chunks(finish_reason: str = "tool_calls", calls: bool = True) -> list[dict[str, Any]]:
    """The same turn streamed: role chunk, reasoning and content in pieces, calls, finish, usage."""
    out = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning_content": "Two "}),
        _chunk({"reasoning_content": "cities."}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "check."}),
    ]
    for i, (cid, name, args) in enumerate(CALLS if calls else []):
        out.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "id": cid,
                            "index": i,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
        out.append(
            _chunk(
                {
                    "tool_calls": [
                        {"index": i, "id": None, "type": "function", "function": {"arguments": args}}
                    ]
                }
            )
        )
    out.append(_chunk({}, finish_reason=finish_reason, matched_stop=None))
    out.append(
        {
            "id": ID,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": MODEL,
            "choices": [],
            "usage": USAGE,
        }
    )
    return out
