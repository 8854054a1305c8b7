"""What the engines built on the official ``openai`` and ``anthropic`` SDKs share: error translation
and the time budget.

Both SDKs are generated from the same template and name their exceptions alike, so one translator
maps either into ``router``'s tree, in one place (as httpx maps httpcore's exceptions in
``_transports/default.py``):

    APITimeoutError, TimeoutError  -> EngineTimeout
    APIConnectionError             -> EngineUnavailable
    APIStatusError                 -> EngineHTTPError(status, message, retry_after=...)
    APIResponseValidationError     -> EngineProtocolError
    the SDK's base error           -> EngineError
    an EngineError from below      -> as it is (the reply cap of ``_http_limits``, raised in an
                                      ``httpx2`` hook, which the SDK neither wraps nor retries)

The SDK carries the one retry loop (``max_retries``, with its own backoff that honours
``Retry-After``); these engines never retry on their own.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

import httpx2
import openai
from pydantic import SecretStr

from fastslow.router import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
)
from fastslow.router.engine_api import Deadline

__all__ = [
    "api_key_or_deferred_error",
    "error_message",
    "openai_errors",
    "request_timeout",
    "retry_after",
    "sdk_errors",
]

# The SDK's default read timeout would outlive any budget we give; a floor keeps a nearly spent budget
# from sending a request that is certain to time out on the first byte.
_MIN_REQUEST_S = 0.001


def retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, then ``retry-after`` (seconds or a date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return value if math.isfinite(value) and value >= 0 else None


def error_message(exc: openai.APIStatusError) -> str:
    """The server's own message: ``{"error": {"message"}}``, ``{"error": "..."}`` or ``{"detail": ...}``."""
    body = exc.body  # the SDK already unwrapped a top-level "error" object
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if value is not None and key == "detail":
                return str(value)
    if isinstance(body, str) and body:
        return body
    return exc.message


@asynccontextmanager
async def sdk_errors(
    sdk: ModuleType,
    engine: str,
    budget_s: float,
    *,
    base: type[Exception],
    message: Callable[[Any], str],
    total_s: float | None = None,
) -> AsyncIterator[Deadline]:
    """Run an SDK call (retries included) within ``budget_s``, translating ``sdk``'s errors.

    Args:
        sdk: the ``openai`` or ``anthropic`` module.
        base: that SDK's base error (``openai.OpenAIError``, ``anthropic.AnthropicError``).
        message: reads the server's own message from an ``APIStatusError``.
        total_s: the whole call's budget, for the timeout message, when ``budget_s`` is what is left of it.

    Yields the ``Deadline`` of ``budget_s`` so each request can take the remaining time as its own timeout.
    """
    deadline = Deadline(budget_s)
    try:
        # The SDK's per-request timeout does not cover its backoff sleeps; this bounds the whole call.
        async with asyncio.timeout(budget_s):
            yield deadline
    except TimeoutError as exc:
        whole = total_s if total_s is not None else budget_s
        raise EngineTimeout(f"no answer within the {whole:g} s budget", engine=engine) from exc
    except sdk.APITimeoutError as exc:  # before APIConnectionError, its base class
        raise EngineTimeout(f"request timed out: {exc.message}", engine=engine) from exc
    except sdk.APIConnectionError as exc:
        cause = exc.__cause__ or exc.__context__
        detail = f"{exc.message} ({cause})" if cause else exc.message
        raise EngineUnavailable(detail, engine=engine) from exc
    except sdk.APIStatusError as exc:
        raise EngineHTTPError(
            exc.status_code, message(exc), engine=engine, retry_after=retry_after(exc.response.headers)
        ) from exc
    except sdk.APIResponseValidationError as exc:
        raise EngineProtocolError(f"reply does not match the SDK's schema: {exc.message}", engine=engine) from exc
    except base as exc:
        raise EngineError(str(exc), engine=engine) from exc


@asynccontextmanager
async def openai_errors(engine: str, budget_s: float) -> AsyncIterator[Deadline]:
    """``sdk_errors`` for the ``openai`` SDK."""
    async with sdk_errors(openai, engine, budget_s, base=openai.OpenAIError, message=error_message) as deadline:
        yield deadline


def request_timeout(deadline: Deadline, engine: str) -> float:
    """The SDK timeout for the next request: whatever is left of the call's budget."""
    if deadline.expired:
        raise EngineTimeout(f"the {deadline.budget_s:g} s budget ran out before the request", engine=engine)
    return max(deadline.remaining, _MIN_REQUEST_S)


def api_key_or_deferred_error(
    key: SecretStr | None, *, setting: str, env: str | None = None
) -> str | Callable[[], Awaitable[str]]:
    """The API key to hand the SDK; without one, a provider that fails when a request needs it.

    Deferring the failure keeps the engine constructible (the registry builds engines from default
    settings) while a call without credentials still ends in a ``ConfigError`` naming the setting.
    """
    if key is not None:
        return key.get_secret_value()
    if env is None:
        return "unused"  # servers without auth (vLLM, llama.cpp, Ollama) ignore the header
    from_env = os.environ.get(env)
    if from_env:
        return from_env

    async def missing() -> str:
        raise ConfigError(f"no API key: set {setting} or {env}", key=setting)

    return missing
