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

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anthropic

from router import (
    Deadline,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)

from .._openai_errors import retry_after

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
    budget_s = deadline.remaining
    try:
        # The SDK's per-request timeout does not cover its backoff sleeps; this bounds the whole call.
        async with asyncio.timeout(budget_s):
            yield
    except TimeoutError as exc:
        raise EngineTimeout(f"no answer within the {deadline.budget_s:g} s budget", engine=engine) from exc
    except anthropic.APITimeoutError as exc:  # before APIConnectionError, its base class
        raise EngineTimeout(f"request timed out: {exc.message}", engine=engine) from exc
    except anthropic.APIConnectionError as exc:
        cause = exc.__cause__ or exc.__context__
        detail = f"{exc.message} ({cause})" if cause else exc.message
        raise EngineUnavailable(detail, engine=engine) from exc
    except anthropic.APIStatusError as exc:
        raise EngineHTTPError(
            exc.status_code,
            error_message(exc),
            engine=engine,
            retry_after=retry_after(exc.response.headers),
        ) from exc
    except anthropic.APIResponseValidationError as exc:
        raise EngineProtocolError(f"reply does not match the SDK's schema: {exc.message}", engine=engine) from exc
    except anthropic.AnthropicError as exc:
        raise EngineError(str(exc), engine=engine) from exc
