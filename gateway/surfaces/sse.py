"""SSE for the surfaces that translate the chat turn's chunks (Anthropic Messages, OpenAI Responses).

Both speak named events (`event: <type>` then `data: <json>`), and one ChatCompletionChunk may
become several of their events. This module owns only that framing; what each event says is
the translation modules' business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

Event = dict[str, Any]


def named_event(event: Event) -> bytes:
    """One SSE event named by its `type`."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def translate_chunks(
    head: list[Event], chunks: AsyncIterator[Event], feed: Callable[[Event], list[Event]]
) -> AsyncIterator[Event]:
    """`head`, then the events `feed` makes of each chunk left in `chunks`."""
    for event in head:
        yield event
    async for chunk in chunks:
        for event in feed(chunk):
            yield event
