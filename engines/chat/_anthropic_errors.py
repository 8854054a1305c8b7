"""Translating the ``anthropic`` SDK's errors into ``router``'s tree, in one place.

    anthropic.APITimeoutError, TimeoutError  -> EngineTimeout
    anthropic.APIConnectionError             -> EngineUnavailable
    anthropic.APIStatusError                 -> EngineHTTPError(status, message, retry_after=...)
                                                (429 rate limit, 529 overloaded, 5xx, 4xx alike)
    anthropic.APIResponseValidationError     -> EngineProtocolError
    any other anthropic.AnthropicError       -> EngineError

The SDK carries the one retry loop (``max_retries``, honouring ``retry-after-ms`` / ``retry-after``);
the engine never retries on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anthropic

from fastslow.engines._sdk_errors import sdk_errors
from fastslow.router.engine_api import Deadline

__all__ = ["anthropic_errors", "error_message"]


def error_message(exc: anthropic.APIStatusError) -> str:
    """The server's own message: ``{"type": "error", "error": {"type", "message"}}``, else the raw body."""
    if exc.api_message:
        return exc.api_message
    body = exc.body
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
    if isinstance(body, str) and body:
        return body
    return exc.message


@asynccontextmanager
async def anthropic_errors(engine: str, deadline: Deadline) -> AsyncIterator[None]:
    """Run one SDK call (its retries included) within what is left of ``deadline``, translating its errors."""
    async with sdk_errors(
        anthropic,
        engine,
        deadline.remaining,
        base=anthropic.AnthropicError,
        message=error_message,
        total_s=deadline.budget_s,
    ):
        yield
