"""A message's content as text: the one flattening every room uses (rendering, the ledger's
message signatures, the teacher).

Content is a string, None (""), or a list of parts; text parts are joined by "\n", the way
OpenAI-compatible servers render a list of text parts into a template. Which parts are text is
decided here too; refusing a request over a part that is not is the caller's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SEPARATOR = "\n"
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def content_text(content: Any) -> str:
    """The text of a message's content: parts joined by "\n", None as "" (anything else as `str`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return SEPARATOR.join(
            p if isinstance(p, str) else str(p.get("text", "")) for p in content if isinstance(p, str | dict)
        )
    return str(content)


def non_text_part(parts: list[Any]) -> str | None:
    """The kind of the first part that is not text (a string, or a text part with a string
    `text`), or None when every part is text."""
    for part in parts:
        if isinstance(part, str):
            continue
        if isinstance(part, Mapping) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            continue
        return part.get("type") if isinstance(part, Mapping) else type(part).__name__
    return None
