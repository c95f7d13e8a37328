"""The gateway's errors in Anthropic's words, for the Messages routes.

Anthropic's clients key on the status, the `error.type` and, for some conditions, the message
text itself (checked against the `anthropic` SDK and Claude Code 2.1):

- a prompt plus `max_tokens` over the context is ``input length and `max_tokens` exceed context
  limit: P + M > C, ...``: Claude Code reads P, M and C out of it and retries with a smaller
  `max_tokens`; a prompt alone over the context is ``prompt is too long: P tokens > C maximum``
  (Claude Code compacts on it);
- an overloaded engine is 529 `overloaded_error` (Anthropic's status; the SDKs retry it);
- a tenant over its limits is 429 `rate_limit_error` with `Retry-After`;
- a gateway error that retrying cannot fix (a finished session: 409, which the SDKs would
  otherwise retry) carries `x-should-retry: false`, the header the SDKs obey;
- the gateway's own error code, when it has one, is in `error.details.error_code`, where
  Claude Code looks for codes such as `mid_conversation_tool_changes_not_supported`.

This module knows nothing about requests or turns; it only words errors.
"""

from __future__ import annotations

from typing import Any

from rlgw.gateway.errors import APIError, ContextLengthExceeded, UpstreamAborted, UpstreamOverloaded

OVERLOADED = 529  # Anthropic's status for an overloaded API

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}
# Statuses the SDKs retry (408, 409, 429, 5xx) that a gateway answer means for good.
_FINAL = frozenset({409})


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error JSON for an HTTP status (and the gateway's code, if any)."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error: dict[str, Any] = {"type": kind, "message": message}
    if code:
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error}


def status_of(exc: APIError) -> int:
    """The status Anthropic answers for the condition (529 for an overloaded or paused engine)."""
    return OVERLOADED if isinstance(exc, UpstreamOverloaded | UpstreamAborted) else exc.status


def message_of(exc: APIError) -> str:
    """The error's message, in Anthropic's wording where its clients parse it."""
    if isinstance(exc, ContextLengthExceeded):
        if exc.max_tokens is None:
            return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum"
        return (
            f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + {exc.max_tokens} "
            f"> {exc.limit}, decrease input length or `max_tokens` and try again"
        )
    return exc.message


def error_headers(exc: APIError) -> dict[str, str] | None:
    """The response headers for an error: its own (`Retry-After`), and `x-should-retry: false`
    where the SDKs would retry what cannot succeed."""
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status in _FINAL:
        headers["x-should-retry"] = "false"
    return headers or None


def anthropic_error_body(exc: APIError) -> dict[str, Any]:
    """Anthropic's error JSON for a gateway error."""
    return error_body(status_of(exc), message_of(exc), exc.code)
