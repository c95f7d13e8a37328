"""Errors the gateway raises: one class per condition, each with its HTTP status and OpenAI body.

GatewayError
├── APIError                       answered to the caller as OpenAI error JSON
│   ├── InvalidRequest             400: the request asks for something wrong or unsupported
│   ├── ContextLengthExceeded      400 `context_length_exceeded`: the prompt does not fit the model
│   ├── AuthError                  401: missing or wrong key
│   ├── NotFound                   404: no such session or object (or another tenant's)
│   ├── Conflict                   409: the session is in a state that forbids the call
│   ├── ClientDisconnected         499: the client left before the reply; the turn was cancelled
│   └── UpstreamError              502: the engine failed
│       ├── UpstreamUnreached      502: no connection was made (the request was never sent)
│       ├── UpstreamOverloaded     503: the engine's queue is full (retried before it reaches a caller)
│       ├── UpstreamTimeout        504: the engine did not answer in time
│       └── UpstreamAborted        503: the engine aborted the generation
└── StartupError                   the gateway cannot start: a configuration problem, not an HTTP answer

This module knows no web framework: the handlers that answer these errors are `http/errors.py`'s.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class APIError(GatewayError):
    """An error with an HTTP status and an OpenAI error body."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error JSON: `{"error": {message, type, param, code}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @property
    def headers(self) -> dict[str, str] | None:
        """Response headers the error needs (every surface's error format sends them)."""
        return None


class InvalidRequest(APIError):
    """400: the request is malformed or asks for something rlgw does not support."""


class ContextLengthExceeded(APIError):
    """400: the prompt plus the requested completion does not fit the model's context.

    The counts are kept apart from the (OpenAI-worded) message so that each surface can word
    the error the way its clients parse it (Anthropic's clients read them out of the message).
    """

    code = "context_length_exceeded"

    def __init__(
        self, message: str, *, param: str, prompt_tokens: int, limit: int, max_tokens: int | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


class AuthError(APIError):
    """401: missing or wrong API key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(APIError):
    """404: no such object visible to the caller."""

    status = 404
    type = "not_found_error"


class Conflict(APIError):
    """409: the object is in a state that forbids the call (for example a finished session)."""

    status = 409
    type = "conflict_error"


class RolloutStored(Conflict):
    """409: the rollout's finish is already stored (its runner died before the answer came back).

    The error object carries that finish's summary under `summary`, so the rerun reports the
    stored result instead of storing the rollout a second time.
    """

    code = "rollout_stored"

    def __init__(self, rollout_id: str, summary: dict[str, Any]) -> None:
        super().__init__(
            f"rollout {rollout_id!r} is already finished and stored (session {summary.get('session_id')}); "
            "its stored summary is in error.summary",
            param="rollout_id",
        )
        self.summary = summary

    def body(self) -> dict[str, Any]:
        """The OpenAI error JSON plus the stored summary."""
        doc = super().body()
        doc["error"]["summary"] = self.summary
        return doc


class ClientDisconnected(APIError):
    """499 (nginx's code): the client disconnected; the turn was cancelled and not recorded."""

    status = 499
    type = "client_disconnected"


class UpstreamError(APIError):
    """The engine could not serve the request (502 by default; 503 overloaded; 504 timeout)."""

    status = 502
    type = "upstream_error"


class UpstreamUnreached(UpstreamError):
    """502: the engine could not be reached; the request was never sent (safe to retry)."""

    code = "engine_unreachable"


class UpstreamOverloaded(UpstreamError):
    """503: the engine is overloaded (its queue is full)."""

    status = 503
    code = "engine_overloaded"


class UpstreamTimeout(UpstreamError):
    """504: the engine did not answer in time."""

    status = 504
    code = "engine_timeout"


class UpstreamAborted(UpstreamError):
    """The engine aborted the generation (paused for a weight update, or aborted by an operator)."""

    status = 503
    code = "engine_aborted"


class StoreUnavailable(APIError):
    """503: the trajectory store or session journal's database cannot be reached (nothing was
    committed for this request; safe to retry once it is back)."""

    status = 503
    type = "store_unavailable"
    code = "store_unavailable"


class SessionMoved(APIError):
    """503: another gateway of a fleet committed turns of this session since this gateway last served
    it (its copy was stale); nothing was committed for this request, and a retry is served from the
    shared journal's turns."""

    status = 503
    type = "session_moved"
    code = "session_moved"


class StartupError(GatewayError):
    """The gateway cannot start: the engine, tokenizer or template is missing or unusable."""
