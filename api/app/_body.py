"""The request guard: framing, size, authentication, then the body, before any route sees a request.

A pure ASGI middleware, so it applies to every route (the Jev gateway and the JSON endpoints
alike). In this order, each step before any byte of the body is read unless it says so:

1. a request framed two ways (``Content-Length`` and ``Transfer-Encoding``, or differing
   ``Content-Length`` values) is a 400 and the connection is closed; the server's protocol
   refuses these first, this is the defence behind it;
2. a declared ``Content-Length`` over ``max_bytes`` is a 413, answered at once;
3. every path under ``/v1/`` is authenticated and counted against its key's rate limit
   (``deps.authenticate``: 401, 403, 429, 503); the ``Caller`` goes into the request state. So a
   caller without a key learns nothing about its body, and every authenticated request counts,
   whether its body is valid or not;
4. an unsupported ``Content-Encoding`` is a 415;
5. the body is read, counting bytes as they arrive (a client that lies in ``Content-Length`` or
   streams without one is stopped at the limit: 413), and must arrive whole within
   ``body_timeout_s`` (else 408 and the connection is closed);
6. ``Content-Encoding: zstd`` is decoded, refused as soon as the *decompressed* size passes the
   limit, so a small zstd bomb cannot exhaust memory.

A 413 goes out whole at once, and the connection stays open for a short while to read and drop what
the client still sends (``DRAIN_BYTES`` within ``DRAIN_TIMEOUT_S``): closing a socket with unread
data makes the kernel reset it, and the client may then never read its 413.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import zstandard
from starlette.datastructures import Headers

from fastslow.router import request_scope

from ._errors import ApiError, error_response
from .deps import CALLER_STATE, authenticate

__all__ = ["DRAIN_BYTES", "DRAIN_TIMEOUT_S", "SUPPORTED_ENCODINGS", "RequestGuardMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_IDENTITY = ("", "identity")
_AUTHENTICATED_PREFIX = "/v1/"
DRAIN_BYTES = 4 * 1024 * 1024
"""The most of a refused body read and dropped after its 413 (beyond that: reset)."""
DRAIN_TIMEOUT_S = 2.0
"""The longest a connection stays open after a 413 to drop what the client still sends."""
SUPPORTED_ENCODINGS = ("identity", "zstd")


class _Refused(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        kind: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
        body_pending: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.kind = kind
        self.headers = dict(headers or {})
        self.close = close
        """End the connection after the response (the stream can no longer be trusted, or the body is unwanted)."""
        self.body_pending = body_pending
        """The client may still be sending the body: drop some of it before closing."""


def _too_large(limit: int, *, body_pending: bool) -> _Refused:
    return _Refused(413, f"the request body is larger than {limit} bytes", close=True, body_pending=body_pending)


def _declared_length(headers: Headers) -> int | None:
    """The body's length the headers declare, if they do; refused when they frame it ambiguously."""
    lengths = {part.strip() for value in headers.getlist("content-length") for part in value.split(",")}
    if len(lengths) > 1:
        raise _Refused(400, "the request has differing Content-Length values", close=True)
    if lengths and "transfer-encoding" in headers:
        raise _Refused(400, "the request has both Content-Length and Transfer-Encoding; send one", close=True)
    if not lengths:
        return None
    length = lengths.pop()
    if not (length.isascii() and length.isdigit()):
        raise _Refused(400, "Content-Length is not a number", close=True)
    return int(length)


def _route_path(scope: Scope) -> str:
    # Routing ignores the root path a proxy mounts the API under; so must the check of what needs a key.
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _decompress(data: bytes, limit: int) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        with reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise _Refused(422, f"the body is not valid zstd: {exc}", field="body") from None
    if len(out) > limit:
        raise _too_large(limit, body_pending=False)
    return out


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of a refused body: ``DRAIN_BYTES`` at most, within ``DRAIN_TIMEOUT_S``."""
    budget = DRAIN_BYTES
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            while budget > 0:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                budget -= len(message.get("body", b""))
    except TimeoutError:
        return  # a client that sends slowly, or nothing, after its 413 pays with a reset


async def _refuse(refused: _Refused, scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(
        refused.status, refused.message, field=refused.field, kind=refused.kind, headers=refused.headers
    )
    if refused.close:
        response.headers["Connection"] = "close"
    if not refused.body_pending:
        await response(scope, receive, send)
        return
    # Status, headers and the whole error body go out now; only the end of the response (after which
    # the server closes the connection) waits for the drain.
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": True})
    await _drain(receive)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class RequestGuardMiddleware:
    """Check a request's framing, size and API key before its body, then read and decode the body.

    Args:
        app: the ASGI app to wrap.
        max_bytes: the largest body accepted, after decompression.
        body_timeout_s: the time a client has to send the whole body once the guard starts reading it.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self._admit(scope)
            scope, body = await self._read(scope, receive)
        except _Refused as refused:
            await _refuse(refused, scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        # One deadline for the work from here on (queueing, System 1, System 2), for the caller's
        # tenant: every stage reads it from the context (fastslow.router.request_scope).
        services = scope.get("state", {}).get("services")
        caller = scope.get("state", {}).get(CALLER_STATE)
        timeout = services.settings.limits.request_timeout_s if services is not None else None
        with request_scope(timeout_s=timeout, tenant=caller.tenant if caller is not None else ""):
            await self.app(scope, replay, send)

    async def _admit(self, scope: Scope) -> None:
        """Everything decided from the headers alone: framing, declared size, the API key, the encoding."""
        headers = Headers(scope=scope)
        declared = _declared_length(headers)
        if declared is not None and declared > self.max_bytes:
            raise _too_large(self.max_bytes, body_pending=True)
        if _route_path(scope).startswith(_AUTHENTICATED_PREFIX):
            state = scope.setdefault("state", {})
            services = state.get("services")
            if services is None:  # no lifespan state: the app is not serving yet
                raise _Refused(503, "the API is not ready; retry later")
            try:
                state[CALLER_STATE] = await authenticate(services, headers.get("authorization"), scope)
            except ApiError as exc:
                raise _Refused(exc.status, exc.message, field=exc.field, kind=exc.kind, headers=exc.headers) from None
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in _IDENTITY and encoding != "zstd":
            raise _Refused(
                415, f"unsupported Content-Encoding {encoding!r}; use one of {', '.join(SUPPORTED_ENCODINGS)}"
            )

    async def _read(self, scope: Scope, receive: Receive) -> tuple[Scope, bytes]:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break  # the client went away; the app sees an empty body and its own disconnect
                    chunk = message.get("body", b"")
                    more = bool(message.get("more_body", False))
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise _too_large(self.max_bytes, body_pending=more)
                    chunks.append(chunk)
                    if not more:
                        break
        except TimeoutError:
            raise _Refused(
                408,
                f"the request body did not arrive within {self.body_timeout_s:g} s",
                kind="request_timeout",
                close=True,
            ) from None
        body = b"".join(chunks)
        if Headers(scope=scope).get("content-encoding", "").strip().lower() == "zstd":
            body = _decompress(body, self.max_bytes)
            # Downstream sees a plain body: no encoding, and a length that matches it.
            raw = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
            raw.append((b"content-length", str(len(body)).encode("ascii")))
            scope = {**scope, "headers": raw}
        return scope, body
