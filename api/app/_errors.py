"""Every error the API sends has one JSON shape: ``{"error": {"type", "message", "field"?}}``.

``ApiError`` is raised by handlers and dependencies; the handlers installed here also translate
FastAPI's validation errors (naming the offending field), Starlette's HTTP errors and fastslow's
own error tree. Bad input is never a 500: only a bug or a broken deployment reaches the catch-all,
and its body says nothing about the internals.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastslow.router import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    InvalidRequest,
    Overloaded,
    failure_summary,
)
from fastslow.router.engine_api import CircuitOpen, failure_log_level

__all__ = [
    "ERROR_RESPONSES",
    "ApiError",
    "ErrorBody",
    "ErrorDetail",
    "StoreUnavailable",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger("fastslow.api")

_TYPES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal",
    501: "not_implemented",
    502: "upstream_error",
    503: "unavailable",
}


class ErrorDetail(BaseModel):
    """What went wrong."""

    type: str = Field(description="Machine-readable kind: unauthorized, not_found, invalid_request, rate_limited, ...")
    message: str = Field(description="A sentence for people.")
    field: str | None = Field(default=None, description="Dotted path of the offending request field, when one is.")


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "Ambiguous request framing (both Content-Length and Transfer-Encoding); the connection is closed.",
        401: "Missing or unknown API key.",
        403: "The API key was revoked, or lacks the scope this operation needs (check, read or review).",
        408: "The request body did not arrive within the server's body timeout.",
        413: "The request body is larger than the server accepts.",
        415: "Unsupported Content-Encoding, or a body sent without Content-Type: application/json.",
        422: "The request is invalid; `field` names the culprit.",
        429: "Too many requests for this API key, or too many failed keys from this address; see Retry-After.",
        503: "The decision log or an engine is unavailable, or an engine's queue is full; see Retry-After.",
    }.items()
}
"""OpenAPI ``responses`` shared by every authenticated operation."""


class ApiError(Exception):
    """An error response: raise it anywhere a request is handled."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        kind: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.kind = kind or _TYPES.get(status, "error")
        self.headers = dict(headers or {})


class StoreUnavailable(ApiError):
    """The decision log could not be reached or did not commit: the request was not acknowledged."""

    def __init__(self, what: str = "the decision log is unavailable") -> None:
        super().__init__(503, f"{what}; nothing was recorded, retry later", kind="store_unavailable")


def error_response(
    status: int,
    message: str,
    *,
    field: str | None = None,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON response for an error."""
    detail = ErrorDetail(type=kind or _TYPES.get(status, "error"), message=message, field=field)
    body = ErrorBody(error=detail).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _field(loc: Sequence[Any]) -> str:
    # FastAPI prefixes where the value came from ("body", "query", ...); the field path is the rest.
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_message(errors: Sequence[Mapping[str, Any]]) -> str:
    shown = [f"{_field(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(shown) + more


async def _on_api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, field=exc.field, kind=exc.kind, headers=exc.headers)


async def _on_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    # A body that is not JSON at all is located at a character offset; the culprit is the body.
    field = "body" if not errors or errors[0].get("type") == "json_invalid" else _field(errors[0].get("loc", ()))
    return error_response(422, _validation_message(errors) or "invalid request", field=field)


async def _on_http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 400:
        # FastAPI's "error parsing the body" (bytes that are not text, say): bad input, reported as
        # every other bad body is.
        return error_response(422, f"the body could not be read: {message}", field="body")
    return error_response(exc.status_code, message, headers=exc.headers)


async def _on_invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    return error_response(422, exc.message, field=exc.field or None)


def _upstream_retry_after(exc: EngineError) -> str:
    """The upstream's own ``Retry-After`` (or an open breaker's wait), else 1 s; whole seconds, at least 1."""
    asked: float | None = None
    if isinstance(exc, EngineHTTPError):
        asked = exc.retry_after
    elif isinstance(exc, CircuitOpen):
        asked = exc.retry_after_s
    return str(max(1, math.ceil(asked))) if asked is not None else "1"


async def _on_engine(_request: Request, exc: Exception) -> JSONResponse:
    # Only the Jev gateway lets engine errors through: decisions escalate or fail closed instead.
    # The client gets the kind of failure; the upstream's body and address go to the log.
    assert isinstance(exc, EngineError)
    log.log(failure_log_level(exc), "engine error: %s", exc)
    message = f"the System-1 engine {failure_summary(exc)}"
    if isinstance(exc, EngineHTTPError) and not exc.retryable or isinstance(exc, EngineProtocolError):
        # The upstream refused what this server sent (its key, its configuration) or answered
        # nonsense: a retry will not help until an operator acts, so no Retry-After.
        return error_response(502, f"{message}; the server's operator has to look", kind="upstream_error")
    kind = "engine_timeout" if isinstance(exc, EngineTimeout) else "engine_unavailable"
    return error_response(503, message, kind=kind, headers={"Retry-After": _upstream_retry_after(exc)})


async def _on_overloaded(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Overloaded)
    # Refused before any decision was made: nothing was recorded, and a retry is safe.
    retry = str(max(1, round(exc.retry_after_s)))
    return error_response(503, f"{exc}", kind="overloaded", headers={"Retry-After": retry})


async def _on_config(_request: Request, exc: Exception) -> JSONResponse:
    log.error("configuration error while serving a request: %s", exc)
    return error_response(500, "the server is misconfigured; see its log", kind="config_error")


async def _on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal error; see the server log")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through ``error_response``."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(InvalidRequest, _on_invalid)
    app.add_exception_handler(EngineError, _on_engine)
    app.add_exception_handler(Overloaded, _on_overloaded)
    app.add_exception_handler(ConfigError, _on_config)
    app.add_exception_handler(Exception, _on_unexpected)
