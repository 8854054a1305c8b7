"""A size cap on the reply bodies the network engines read, shared by the Jev client and the SDK engines.

``limit_reply`` arms one streamed ``httpx2.Response``: a declared ``Content-Length`` over the cap is
refused before any of the body is read, and reading stops as soon as the body passes the cap
(chunked or not). The count is of decoded bytes: a compressed body is inflated here, in small
slices, so a few kilobytes of gzip cannot become gigabytes in memory before the count sees them.
Either way the reply is an ``EngineProtocolError`` naming the limit and its setting; the caller's
``httpx2`` client closes the half-read connection instead of returning it to the pool.

The SDK engines read replies inside the SDK, so their client runs ``limit_reply`` as a ``response``
event hook (``capped_client``). A hook, not a wrapping transport: a client given a ``transport``
stops honouring proxy variables from the environment, and a hook also sees the bodies of
redirects the client follows. The SDK passes an ``EngineProtocolError`` through untouched (it
retries and wraps only ``httpx2``'s own errors), so a reply too large is never retried.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any

import httpx2

from fastslow.router import EngineProtocolError
from fastslow.router.engine_api import Deadline
from fastslow.router.settings import LimitsSettings

__all__ = [
    "DEFAULT_MAX_REPLY_BYTES",
    "REPLY_LIMIT_SETTING",
    "ReplyCap",
    "capped_client",
    "limit_reply",
    "limit_reply_sync",
]

DEFAULT_MAX_REPLY_BYTES: int = LimitsSettings().max_engine_reply_bytes
"""The cap an engine built outside the registry gets: the setting's default (8 MiB)."""

REPLY_LIMIT_SETTING = "limits.max_engine_reply_bytes"

# Deflate inflates at most about 1032:1, so a compressed slice this small grows to about 1 MiB at
# most before the count checks it; the decoders inflate a whole network read (up to 64 KiB) at once.
_COMPRESSED_SLICE = 1024


def _too_large(max_bytes: int, engine: str, *, declared: int | None = None) -> EngineProtocolError:
    limit = f"the {max_bytes}-byte limit ({REPLY_LIMIT_SETTING})"
    if declared is not None:
        message = f"the reply declares a {declared}-byte body, over {limit}; not read"
    else:
        message = f"the reply body runs past {limit}; reading stopped there"
    return EngineProtocolError(message, engine=engine)


def limit_reply(response: httpx2.Response, max_bytes: int, *, engine: str) -> None:
    """Make reading ``response``'s body (not yet read) fail once it passes ``max_bytes``.

    Raises:
        EngineProtocolError: the reply declares a ``Content-Length`` over ``max_bytes``; later, from
            reading the body, when it turns out longer.
    """
    encoding = _declared(response, max_bytes, engine)
    response.stream = _CappedStream(_as_async(response.stream), max_bytes, engine=engine, encoding=encoding)


def limit_reply_sync(response: httpx2.Response, max_bytes: int, *, engine: str, deadline: Deadline) -> None:
    """``limit_reply`` for a sync client's response, whose reading also stops at ``deadline``.

    A sync read cannot be cancelled: ``httpx2``'s timeouts bound each read, and the deadline is
    checked between reads, so a server trickling its reply is cut off within one read of it.

    Raises:
        EngineProtocolError: as ``limit_reply``.
        TimeoutError: from reading the body, once the deadline has passed.
    """
    encoding = _declared(response, max_bytes, engine)
    stream = response.stream
    if not isinstance(stream, httpx2.SyncByteStream):
        raise TypeError("limit_reply_sync reads sync responses only")
    response.stream = _SyncCappedStream(stream, max_bytes, engine=engine, encoding=encoding, deadline=deadline)


def _declared(response: httpx2.Response, max_bytes: int, engine: str) -> str | None:
    """Refuse a declared length over the cap; the content encoding the cap's stream inflates, if any."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes, engine, declared=int(declared))
    encoding = response.headers.get("content-encoding")
    if encoding is not None:
        # Inflated by the cap's stream; left in place, the response would inflate it a second time.
        del response.headers["content-encoding"]
    return encoding


class ReplyCap:
    """An ``httpx2`` ``response`` event hook that applies ``limit_reply`` to every reply."""

    def __init__(self, max_bytes: int, *, engine: str) -> None:
        self.max_bytes = max_bytes
        self.engine = engine

    async def __call__(self, response: httpx2.Response) -> None:
        limit_reply(response, self.max_bytes, engine=self.engine)


def capped_client(
    max_bytes: int,
    *,
    engine: str,
    factory: Callable[..., httpx2.AsyncClient] = httpx2.AsyncClient,
    **kwargs: Any,
) -> httpx2.AsyncClient:
    """A client from ``factory(**kwargs)`` whose every reply is capped at ``max_bytes``.

    Pass the SDK's own client class (``openai.DefaultAsyncHttpxClient``) as ``factory`` to keep the
    SDK's connection limits and redirect handling.
    """
    hooks: dict[str, list[Callable[..., Any]]] = {"request": [], "response": []}
    for kind, given in dict(kwargs.pop("event_hooks", None) or {}).items():
        hooks.setdefault(kind, []).extend(given)
    hooks["response"].append(ReplyCap(max_bytes, engine=engine))
    return factory(event_hooks=hooks, **kwargs)


def _as_async(stream: httpx2.SyncByteStream | httpx2.AsyncByteStream) -> httpx2.AsyncByteStream:
    if not isinstance(stream, httpx2.AsyncByteStream):
        raise TypeError("the reply cap reads async responses only")
    return stream


@contextlib.asynccontextmanager
async def _iterating(body: AsyncIterable[bytes]) -> AsyncIterator[AsyncIterator[bytes]]:
    """Iterate ``body``, closing its generator in this task however the loop ends (as httpx2 does)."""
    parts = aiter(body)
    try:
        yield parts
    finally:
        if isinstance(parts, AsyncGenerator):
            await parts.aclose()


def _sliced(part: bytes) -> Iterator[bytes]:
    view = memoryview(part)
    for start in range(0, len(view), _COMPRESSED_SLICE):
        yield bytes(view[start : start + _COMPRESSED_SLICE])


class _Slices(httpx2.AsyncByteStream):
    """The compressed body in slices of ``_COMPRESSED_SLICE`` bytes, for the decoder to inflate one by one."""

    def __init__(self, body: httpx2.AsyncByteStream) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async with _iterating(self._body) as parts:
            async for part in parts:
                for piece in _sliced(part):
                    yield piece

    async def aclose(self) -> None:
        await self._body.aclose()


class _SyncSlices(httpx2.SyncByteStream):
    """``_Slices`` for a sync body."""

    def __init__(self, body: httpx2.SyncByteStream) -> None:
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        for part in self._body:
            yield from _sliced(part)

    def close(self) -> None:
        self._body.close()


class _Cap:
    """What the async and sync capped streams share: the count against the cap, the body's timing."""

    def __init__(self, body: Any, max_bytes: int, engine: str) -> None:
        self._body = body
        self._max_bytes = max_bytes
        self._engine = engine
        self._seen = 0

    @property
    def elapsed(self) -> datetime.timedelta | None:
        """What ``httpx2.Response.elapsed`` reads from its stream: the wrapped body's timing."""
        elapsed: datetime.timedelta | None = getattr(self._body, "elapsed", None)
        return elapsed

    def _count(self, part: bytes) -> None:
        self._seen += len(part)
        if self._seen > self._max_bytes:
            raise _too_large(self._max_bytes, self._engine)


class _CappedStream(_Cap, httpx2.AsyncByteStream):
    """A reply body (inflated when ``encoding`` says so) that raises once it passes ``max_bytes``."""

    def __init__(self, body: httpx2.AsyncByteStream, max_bytes: int, *, engine: str, encoding: str | None) -> None:
        super().__init__(body, max_bytes, engine)
        # httpx2 inflates a body by its headers; a bare response lends us its decoders.
        self._inflated = (
            httpx2.Response(200, headers={"content-encoding": encoding}, stream=_Slices(body))
            if encoding is not None
            else None
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = self._inflated.aiter_bytes() if self._inflated is not None else self._body
        async with _iterating(body) as parts:
            async for part in parts:
                self._count(part)
                yield part

    async def aclose(self) -> None:
        await self._body.aclose()


class _SyncCappedStream(_Cap, httpx2.SyncByteStream):
    """``_CappedStream`` for a sync body, which also raises ``TimeoutError`` once ``deadline`` passes."""

    def __init__(
        self, body: httpx2.SyncByteStream, max_bytes: int, *, engine: str, encoding: str | None, deadline: Deadline
    ) -> None:
        super().__init__(body, max_bytes, engine)
        self._deadline = deadline
        self._inflated = (
            httpx2.Response(200, headers={"content-encoding": encoding}, stream=_SyncSlices(body))
            if encoding is not None
            else None
        )

    def __iter__(self) -> Iterator[bytes]:
        body = self._inflated.iter_bytes() if self._inflated is not None else self._body
        for part in body:
            self._count(part)
            if self._deadline.remaining <= 0.0:
                raise TimeoutError(f"the reply was still arriving at the {self._deadline.budget_s:g} s deadline")
            yield part

    def close(self) -> None:
        self._body.close()
