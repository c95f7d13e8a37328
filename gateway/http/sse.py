"""Server-sent events: the framing of one event, and a stream whose errors after the first byte
travel in-stream.

OpenAI's surfaces send `data: <json>` lines closed by `data: [DONE]`; Anthropic's and the
Responses API's send named events (`event: <type>` then `data: <json>`). What each event says
is the surfaces' business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from rlgw.gateway.errors import APIError


def named_event(event: dict[str, Any]) -> bytes:
    """One SSE event named by its `type`."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def data_event(doc: dict[str, Any]) -> bytes:
    """One SSE event as OpenAI sends it: a `data:` line."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def sse_stream(
    first: dict[str, Any],
    rest: AsyncIterator[dict[str, Any]],
    *,
    encode: Callable[[dict[str, Any]], bytes] = data_event,
    error: Callable[[APIError], bytes] | None = None,
    done: bytes = b"data: [DONE]\n\n",
) -> AsyncIterator[bytes]:
    """SSE events for `first` and the rest; an error after the first byte travels in-stream.

    `encode` writes one event (OpenAI's `data:` lines by default; surfaces with named events
    pass their own), `error` an in-stream error, `done` the closing line (b"" for none).
    """
    yield encode(first)
    try:
        async for chunk in rest:
            yield encode(chunk)
    except APIError as exc:
        # After the first byte the status line is gone: errors travel in-stream.
        yield error(exc) if error is not None else encode(exc.body())
    if done:
        yield done
