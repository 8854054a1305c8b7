"""Request bodies: the size limit and ``Content-Encoding: zstd``, before any route sees them.

A pure ASGI middleware, so it applies to every route (the Jev gateway and the JSON endpoints
alike) and counts bytes as they arrive: a client that lies in ``Content-Length`` or streams
without one is stopped at the limit, and a compressed body is refused as soon as its
*decompressed* size passes the limit, so a small zstd bomb cannot exhaust memory.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import zstandard
from starlette.datastructures import Headers

from ._errors import error_response

__all__ = ["RequestBodyMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_IDENTITY = ("", "identity")
DRAIN_BYTES = 16 * 1024 * 1024
"""How much of a refused body is read and dropped so the client gets its 413 (beyond that: reset)."""
SUPPORTED_ENCODINGS = ("identity", "zstd")


class _Refused(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def _too_large(limit: int) -> _Refused:
    return _Refused(413, f"the request body is larger than {limit} bytes")


def _decompress(data: bytes, limit: int) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        with reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise _Refused(422, f"the body is not valid zstd: {exc}", field="body") from None
    if len(out) > limit:
        raise _too_large(limit)
    return out


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a refused body, up to ``budget`` bytes.

    Closing a connection with unread data makes the kernel reset it, and the client may then never
    read its 413; past the budget, that is the price a client sending that much pays.
    """
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


class RequestBodyMiddleware:
    """Enforce ``max_bytes`` on request bodies and decode ``Content-Encoding: zstd``.

    Args:
        app: the ASGI app to wrap.
        max_bytes: the largest body accepted, after decompression.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            scope, body = await self._read(scope, receive)
        except _Refused as exc:
            response = error_response(exc.status, exc.message, field=exc.field)
            if exc.status == 413:
                response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> tuple[Scope, bytes]:
        headers = Headers(scope=scope)
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in _IDENTITY and encoding != "zstd":
            raise _Refused(
                415, f"unsupported Content-Encoding {encoding!r}; use one of {', '.join(SUPPORTED_ENCODINGS)}"
            )
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(receive, DRAIN_BYTES)
            raise _too_large(self.max_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app sees an empty body and its own disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive, DRAIN_BYTES)
                raise _too_large(self.max_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if encoding == "zstd":
            body = _decompress(body, self.max_bytes)
            # Downstream sees a plain body: no encoding, and a length that matches it.
            raw = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
            raw.append((b"content-length", str(len(body)).encode("ascii")))
            scope = {**scope, "headers": raw}
        return scope, body
