"""The gateway's errors as HTTP answers: FastAPI's exception handlers, in OpenAI's error format.

The error classes are `rlgw.gateway.errors`' (no web types there); this module owns only how
they, Starlette's `HTTPException` and request validation errors are answered.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from rlgw.gateway.errors import APIError


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response encoded with orjson."""
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


async def handle_api_error(request: Request, exc: Exception) -> Response:
    """FastAPI handler: `APIError` -> its status, OpenAI body and headers (a 429's `Retry-After`)."""
    assert isinstance(exc, APIError)
    return json_response(exc.status, exc.body(), headers=exc.headers)


_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "method_not_allowed", 413: "request_too_large"}


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's and FastAPI's `HTTPException` (unknown route 404, wrong method 405, ...) ->
    OpenAI body; a dict `detail` is the error object. Headers such as `Allow` are kept."""
    assert isinstance(exc, HTTPException)
    detail = exc.detail
    if not isinstance(detail, dict):
        status = exc.status_code
        message = str(detail)
        if status == 404:
            message = f"no route {request.method} {request.url.path}"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        detail = {
            "message": message,
            "type": _HTTP_ERROR_TYPES.get(status, "invalid_request_error"),
            "param": None,
            "code": None,
        }
    return json_response(exc.status_code, {"error": detail}, headers=getattr(exc, "headers", None))


def validation_message(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """A validation error's first problem, named by its field: (message, the field's path)."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = f"{loc}: {first.get('msg', 'invalid request')}" if loc else str(first.get("msg", "invalid"))
    return message, loc or None


async def handle_validation_error(request: Request, exc: Exception) -> Response:
    """Request validation errors (FastAPI's or pydantic's) -> 400 with the first problem named."""
    assert isinstance(exc, RequestValidationError | ValidationError)
    message, loc = validation_message(exc)
    return json_response(
        400,
        {"error": {"message": message, "type": "invalid_request_error", "param": loc, "code": None}},
    )


def install_error_handlers(app: Any) -> None:
    """Make every error of `app` answer in OpenAI's error format."""
    app.add_exception_handler(APIError, handle_api_error)
    app.add_exception_handler(HTTPException, handle_http_exception)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(ValidationError, handle_validation_error)
