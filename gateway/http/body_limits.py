"""Caps on what one request may carry: body bytes (413), messages and tools (400).

The body cap is applied by the gateway's edge (`serving/edge.py`) with the functions here: a
declared `Content-Length` over the cap is answered 413 before a byte is read; a body without
one (chunked) is counted as it arrives and the read that crosses the cap raises
`BodyTooLarge`, which the app's HTTPException handler answers as 413 in OpenAI's error
format. Nothing is buffered here.

The message and tool caps need the parsed JSON: `parse_body` reads a turn's JSON body and checks
them on it (no second parse). This module knows no
surface's request shape beyond the `messages`/`input`/`contents` and `tools` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request

from rlgw.gateway import metrics
from rlgw.gateway.errors import InvalidRequest

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_TOOLS = 512


@dataclass(frozen=True, slots=True)
class RequestCaps:
    """What one request may carry; None is uncapped."""

    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    max_messages: int | None = DEFAULT_MAX_MESSAGES
    max_tools: int | None = DEFAULT_MAX_TOOLS


def _too_large_detail(cap: int) -> dict[str, Any]:
    return {
        "message": f"The request body is larger than this gateway's limit of {cap} bytes.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }


class BodyTooLarge(HTTPException):
    """413: the request body is larger than the cap (raised while the body is read)."""

    def __init__(self, cap: int) -> None:
        super().__init__(status_code=413, detail=_too_large_detail(cap))


def check_counts(doc: dict[str, Any], caps: RequestCaps) -> None:
    """400 naming the parameter if `doc` has more messages (or input items, or Gemini contents) or
    tools than allowed."""
    for param, cap in (
        ("messages", caps.max_messages),
        ("input", caps.max_messages),
        ("contents", caps.max_messages),
        ("tools", caps.max_tools),
    ):
        items = doc.get(param)
        if cap is not None and isinstance(items, list) and len(items) > cap:
            metrics.reject(f"too_many_{'tools' if param == 'tools' else 'messages'}")
            raise InvalidRequest(
                f"'{param}' has {len(items)} items; this gateway accepts at most {cap} per request.",
                param=param,
                code=f"too_many_{param}",
            )


def declared_over(scope: dict[str, Any], cap: int) -> bool:
    """Whether the request declares a `Content-Length` over `cap` (counted as a reject)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                return False
            if declared > cap:
                metrics.reject("body_too_large")
                return True
            return False
    return False


def capped(receive: Callable[..., Any], cap: int) -> Callable[..., Any]:
    """`receive`, raising `BodyTooLarge` on the read that carries the body past `cap` bytes."""
    seen = 0

    async def capped_receive() -> dict[str, Any]:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > cap:
                metrics.reject("body_too_large")
                raise BodyTooLarge(cap)
        return message

    return capped_receive


async def send_413(send: Callable[..., Any], cap: int) -> None:
    """Answer 413 in OpenAI's error format without reading the body."""
    body = orjson.dumps({"error": _too_large_detail(cap)})
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The client may still be sending: ask it not to reuse the connection.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def parse_body(request: Request) -> dict[str, Any]:
    """The JSON object body of a request (400 if it is not one, or if it carries more messages or
    tools than the gateway's caps allow)."""
    try:
        doc = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidRequest("the body must be a JSON object")
    check_counts(doc, request.app.state.request_caps)
    return doc
