"""One POST with retries inside a time budget, and HTTP failures translated into router's errors.

Retries follow ``typesafe-sdk``'s policy: 408, 429, 5xx (529 included), connection errors and
timeouts; backoff from 0.5 s doubling to a 5 s cap with up to 25 % jitter subtracted;
``retry-after-ms`` and ``Retry-After`` (seconds or an HTTP date) win over backoff. Unlike the SDK,
every attempt and every pause fits in the caller's ``Deadline``: we never sleep past it, and an
attempt's whole exchange (connect, send, headers, every byte of the body) is cut off at it, since
``httpx2``'s timeouts are per read and a server trickling its reply would outlive any of them.
No retry is started once ``may_retry`` says no (checked before each pause and after it): by
default the circuit breaker the call runs behind (``fastslow.router.engine_api.may_retry``), so a
breaker that opened meanwhile stops the loop and a half-open probe is one attempt.

Reply bodies are read with a size cap (``fastslow.engines._http_limits``); a reply too large is an
``EngineProtocolError`` and is not retried.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import httpx2

from fastslow.engines._http_limits import DEFAULT_MAX_REPLY_BYTES, limit_reply, limit_reply_sync
from fastslow.router import EngineError, EngineHTTPError, EngineProtocolError, EngineTimeout, EngineUnavailable
from fastslow.router.engine_api import Deadline, GenAI, TraceAttr, TraceEvent, inject_trace_headers, trace_event
from fastslow.router.engine_api import may_retry as breaker_allows_retry

__all__ = [
    "backoff_s",
    "client_headers",
    "error_message",
    "post_with_retries",
    "post_with_retries_sync",
    "retry_after_s",
]

RETRYABLE_STATUSES = frozenset({408, 429, *range(500, 600)})
_MAX_BODY_CHARS = 500


def backoff_s(retry: int, *, initial: float = 0.5, cap: float = 5.0, jitter: float = 0.25) -> float:
    """Pause before retry number ``retry`` (0-based): ``initial * 2**retry`` capped, minus jitter."""
    delay = min(cap, initial * (2.0**retry))
    return delay * (1.0 - random.random() * jitter)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms`` first, then ``Retry-After``."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms.strip())
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and ms >= 0:
            return ms / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw.strip())
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError, OverflowError):
            return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _detail_text(detail: Any) -> str | None:
    if isinstance(detail, str):
        return detail or None
    if isinstance(detail, Mapping) and isinstance(detail.get("message"), str):
        return str(detail["message"])
    if isinstance(detail, list):  # FastAPI validation: [{"loc": [...], "msg": ...}]
        parts = []
        for entry in detail:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("msg"), str):
                continue
            loc = entry.get("loc")
            where = ".".join(str(p) for p in loc if p != "body") if isinstance(loc, list) else ""
            parts.append(f"{where}: {entry['msg']}" if where else entry["msg"])
        return "; ".join(parts) or None
    return None


def error_message(content: bytes, reason: str = "") -> str:
    """A readable message from any error body a Jev-shaped server sends.

    Reads ``{"detail": "..." | [...]}`` (FastAPI, jev-compatible-server), ``{"error": {"message",
    "field" | "type"}}`` (laya-serve, the structured server), ``{"error": "..."}`` (llm2jev) and
    ``{"message": "..."}``; anything else is returned as (truncated) text.
    """
    text = content.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    message: str | None = None
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, str) and error:
            message = error
        elif isinstance(error, Mapping) and isinstance(error.get("message"), str):
            message = str(error["message"])
            extras = [f"{key} {error[key]}" for key in ("field", "type", "code") if error.get(key) not in (None, "")]
            if extras:
                message += f" ({', '.join(extras)})"
        elif isinstance(body.get("message"), str):
            message = str(body["message"])
        else:
            message = _detail_text(body.get("detail"))
    elif isinstance(body, str):
        message = body or None
    if message is None:
        message = text[:_MAX_BODY_CHARS] + ("…" if len(text) > _MAX_BODY_CHARS else "") if text else ""
    return message or reason or "no error message"


async def post_with_retries(
    client: httpx2.AsyncClient,
    url: str | httpx2.URL,
    *,
    content: bytes,
    headers: Mapping[str, str],
    deadline: Deadline,
    max_retries: int,
    engine: str,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    may_retry: Callable[[], bool] | None = None,
) -> httpx2.Response:
    """POST until a 2xx reply, a non-retryable status, ``max_retries`` retries, ``may_retry()`` or the deadline.

    The response comes back read (``response.content``) and its connection released. ``headers``
    go over the client's default headers; an ``httpx2.Headers`` from ``client_headers`` is sent as
    it is, merged once for many requests. ``may_retry`` (by default, the call's circuit breaker
    being closed) is asked before each retry; when it says no, the last error is raised.

    Raises:
        EngineHTTPError: an error status that is not retryable, or the last one when retries or
            time ran out.
        EngineTimeout: the budget ran out before a whole reply came.
        EngineUnavailable: the server could not be reached on the last attempt.
        EngineProtocolError: a reply body over ``max_reply_bytes`` (declared or read), or one that
            cannot be decoded; neither is retried.
    """
    target = url if isinstance(url, httpx2.URL) else httpx2.URL(url)
    attempts = _Attempts(target, deadline, max_retries, engine, may_retry)
    while True:
        remaining = attempts.remaining()
        try:
            async with asyncio.timeout(remaining):
                response = await _exchange(
                    client,
                    target,
                    content=content,
                    headers=headers,
                    timeout_s=remaining,
                    max_reply_bytes=max_reply_bytes,
                    engine=engine,
                )
        except (httpx2.HTTPError, TimeoutError) as exc:
            attempts.failed(exc)
        else:
            if response.is_success:
                return response
            attempts.refused(response)
        await asyncio.sleep(attempts.pause())


def post_with_retries_sync(
    client: httpx2.Client,
    url: str | httpx2.URL,
    *,
    content: bytes,
    headers: Mapping[str, str],
    deadline: Deadline,
    max_retries: int,
    engine: str,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    may_retry: Callable[[], bool] | None = None,
) -> httpx2.Response:
    """``post_with_retries`` over a sync client, blocking the calling thread.

    The same retries, errors and deadline; a sync read cannot be cancelled, so a server trickling
    its reply is cut off within one read of the deadline rather than at it.
    """
    target = url if isinstance(url, httpx2.URL) else httpx2.URL(url)
    attempts = _Attempts(target, deadline, max_retries, engine, may_retry)
    while True:
        remaining = attempts.remaining()
        try:
            response = _exchange_sync(
                client,
                target,
                content=content,
                headers=headers,
                deadline=deadline,
                timeout_s=remaining,
                max_reply_bytes=max_reply_bytes,
                engine=engine,
            )
        except (httpx2.HTTPError, TimeoutError) as exc:
            attempts.failed(exc)
        else:
            if response.is_success:
                return response
            attempts.refused(response)
        time.sleep(attempts.pause())


class _Attempts:
    """The retry policy of one POST, shared by the async and sync loops: what failed, and what next."""

    def __init__(
        self,
        url: httpx2.URL,
        deadline: Deadline,
        max_retries: int,
        engine: str,
        may_retry: Callable[[], bool] | None = None,
    ) -> None:
        self.url = url
        self.deadline = deadline
        self.max_retries = max_retries
        self.engine = engine
        self.may_retry = may_retry if may_retry is not None else breaker_allows_retry
        self.retry = 0
        self.last: EngineError | None = None
        self.wait: float | None = None

    def _earlier(self) -> str:
        return f"; the attempt before failed with {self.last}" if self.last is not None else ""

    def remaining(self) -> float:
        """The time left for the next attempt; raises ``EngineTimeout`` when none is.

        Before a retry it raises the last error instead when ``may_retry`` turned to no during the pause.
        """
        if self.last is not None and not self.may_retry():
            raise self.last
        remaining = self.deadline.remaining
        if remaining <= 0.0:
            message = f"no reply within the {self.deadline.budget_s:g} s budget{self._earlier()}"
            raise EngineTimeout(message, engine=self.engine)
        self.wait = None
        return remaining

    def failed(self, exc: httpx2.HTTPError | TimeoutError) -> None:
        """An attempt raised: remember it as an engine error, or raise what is not retried."""
        if isinstance(exc, (httpx2.TimeoutException, TimeoutError)):
            # asyncio's TimeoutError says nothing; httpx2's names the phase that timed out.
            detail = f" ({exc!r})" if isinstance(exc, httpx2.TimeoutException) else ""
            message = f"no whole reply within the {self.deadline.budget_s:g} s budget{detail}{self._earlier()}"
            last: EngineError = EngineTimeout(message, engine=self.engine)
        elif isinstance(exc, httpx2.DecodingError):
            raise EngineProtocolError(f"cannot decode the reply body: {exc}", engine=self.engine) from exc
        elif isinstance(exc, httpx2.TransportError):
            last = EngineUnavailable(f"cannot reach {self.url}: {exc!r}", engine=self.engine)
        else:
            raise exc
        last.__cause__ = exc
        self.last = last

    def refused(self, response: httpx2.Response) -> None:
        """An error status: remember it, or raise it when it is not retried."""
        self.wait = retry_after_s(response.headers)
        self.last = EngineHTTPError(
            response.status_code,
            error_message(response.content, response.reason_phrase),
            engine=self.engine,
            retry_after=self.wait,
        )
        if response.status_code not in RETRYABLE_STATUSES:
            raise self.last

    def pause(self) -> float:
        """The pause before the next attempt; raises the last error when no retry is due or fits."""
        assert self.last is not None
        if self.retry >= self.max_retries or not self.may_retry():
            raise self.last
        pause = self.wait if self.wait is not None else backoff_s(self.retry)
        if pause >= self.deadline.remaining:
            raise self.last
        self.retry += 1
        status = self.last.status if isinstance(self.last, EngineHTTPError) else None
        trace_event(
            TraceEvent.RETRY,
            {
                TraceAttr.ATTEMPT: self.retry + 1,
                GenAI.ERROR_TYPE: str(status) if status is not None else type(self.last).__name__,
                "fastslow.retry.pause_s": round(pause, 3),
            },
        )
        return pause


def client_headers(client: httpx2.AsyncClient | httpx2.Client, headers: Mapping[str, str]) -> httpx2.Headers:
    """``headers`` over ``client``'s defaults, as ``client.build_request`` would send them, built once.

    Pass the result to ``post_with_retries`` to send many requests without merging them each time.
    """
    merged = httpx2.Headers(client.headers)
    merged.update(headers)
    return merged


def _request(
    client: httpx2.AsyncClient | httpx2.Client,
    url: httpx2.URL,
    content: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
) -> httpx2.Request:
    if url.is_relative_url or client.cookies or client.params:
        request = client.build_request(
            "POST", url, content=content, headers=dict(headers), timeout=httpx2.Timeout(timeout_s)
        )
    else:
        # Built here rather than by ``client.build_request``, which parses the URL and merges the
        # client's headers again on every call: a third of a stubbed decision's time.
        sent = headers if isinstance(headers, httpx2.Headers) else client_headers(client, headers)
        request = httpx2.Request(
            "POST", url, content=content, headers=sent, extensions={"timeout": httpx2.Timeout(timeout_s).as_dict()}
        )
    # W3C trace context of the engine call's span (the request's own copy of the headers): the
    # trace goes on into vLLM or Jev. Nothing is added while no span is recorded.
    inject_trace_headers(request.headers)
    return request


async def _exchange(
    client: httpx2.AsyncClient,
    url: httpx2.URL,
    *,
    content: bytes,
    headers: Mapping[str, str],
    timeout_s: float,
    max_reply_bytes: int,
    engine: str,
) -> httpx2.Response:
    """One POST, its body read under the size cap; a reply cut short closes its connection."""
    response = await client.send(_request(client, url, content, headers, timeout_s), stream=True)
    try:
        limit_reply(response, max_reply_bytes, engine=engine)
        await response.aread()
    except BaseException:
        # Closing a half-read response closes its connection: the pool never reuses it mid-reply.
        await response.aclose()
        raise
    return response


def _exchange_sync(
    client: httpx2.Client,
    url: httpx2.URL,
    *,
    content: bytes,
    headers: Mapping[str, str],
    deadline: Deadline,
    timeout_s: float,
    max_reply_bytes: int,
    engine: str,
) -> httpx2.Response:
    """``_exchange`` over a sync client; reading stops at ``deadline``."""
    response = client.send(_request(client, url, content, headers, timeout_s), stream=True)
    try:
        limit_reply_sync(response, max_reply_bytes, engine=engine, deadline=deadline)
        response.read()
    except BaseException:
        response.close()
        raise
    return response
