"""The gateway's errors in Gemini's words, for the `generateContent` routes.

Google's APIs answer `{"error": {"code": HTTP status, "message": ..., "status": canonical code}}`
(https://ai.google.dev/gemini-api/docs/troubleshooting): INVALID_ARGUMENT for a bad request,
UNAUTHENTICATED, NOT_FOUND, RESOURCE_EXHAUSTED (429, which Gemini CLI and the SDKs retry),
UNAVAILABLE (503, an overloaded or paused engine: retried too), DEADLINE_EXCEEDED (504). A prompt
over the context is worded as Gemini words it. The gateway's own error code, when it has one,
is in `error.details` as a `google.rpc.ErrorInfo` reason.

This module knows nothing about requests or turns; it only words errors.
"""

from __future__ import annotations

from typing import Any

from rlgw.gateway.errors import APIError, ContextLengthExceeded

# Google's canonical codes by HTTP status (google.rpc.Code's HTTP mapping).
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def error_body(status: int, message: str, reason: str | None = None) -> dict[str, Any]:
    """Gemini's error JSON for an HTTP status (and the gateway's error code as its reason)."""
    code = _STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    error: dict[str, Any] = {"code": status, "message": message, "status": code}
    if reason:
        error["details"] = [{"@type": _ERROR_INFO, "reason": reason, "domain": "rlgw"}]
    return {"error": error}


def message_of(exc: APIError) -> str:
    """The error's message, in Gemini's wording for a prompt over the context."""
    if not isinstance(exc, ContextLengthExceeded):
        return exc.message
    asked = "" if exc.max_tokens is None else f" plus maxOutputTokens ({exc.max_tokens})"
    return (
        f"The input token count ({exc.prompt_tokens}){asked} exceeds the maximum number of tokens "
        f"allowed ({exc.limit})."
    )


def gemini_error_body(exc: APIError) -> dict[str, Any]:
    """Gemini's error JSON for a gateway error."""
    return error_body(exc.status, message_of(exc), exc.code)
