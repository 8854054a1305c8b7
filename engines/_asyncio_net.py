"""An ``httpx2`` transport whose connections are plain asyncio streams, for the engines' own clients.

``httpx2.AsyncHTTPTransport`` reaches its sockets through httpcore's anyio backend, and on the
policy-check hot path that backend was a fifth of the server's time (``bench/http_service.py``
under ``py-spy``): the pool asks every idle connection ``has_expired()`` on each request and each
release, and each answer built anyio's typed-attribute mapping afresh before one ``select``; every
read and write also entered an anyio cancel scope. httpcore takes any ``AsyncNetworkBackend``, so
this one speaks asyncio directly: a read is one ``StreamReader.read``, a deadline one
``asyncio.timeout``, and "is an idle connection readable" is the reader's own state (asyncio reads
the socket as data arrives, so a server's close is already there as end of file).

Everything above the socket (HTTP/1.1 framing, pooling, keep-alive expiry, TLS through
``start_tls``, the mapping of httpcore's errors to ``httpx2``'s) stays httpcore's and httpx2's.
Under another event loop (trio) connections fall back to httpcore's own backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import typing
from collections.abc import AsyncIterator, Iterable

import httpcore2
import httpx2
import sniffio

__all__ = ["AsyncioBackend", "AsyncioStream", "fast_transport"]

_Option = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


@contextlib.asynccontextmanager
async def _within(timeout: float | None, timed_out: type[Exception], failed: type[Exception]) -> AsyncIterator[None]:
    """httpcore's error for a deadline passed or a socket failing, from asyncio's."""
    try:
        if timeout is None:
            yield
        else:
            async with asyncio.timeout(timeout):
                yield
    except TimeoutError as exc:
        raise timed_out(str(exc) or "timed out") from exc
    except (OSError, EOFError, ssl.SSLError) as exc:
        raise failed(str(exc) or type(exc).__name__) from exc


class AsyncioStream(httpcore2.AsyncNetworkStream):
    """One connection: an asyncio reader and writer pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        async with _within(timeout, httpcore2.ReadTimeout, httpcore2.ReadError):
            return await self._reader.read(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        async with _within(timeout, httpcore2.WriteTimeout, httpcore2.WriteError):
            self._writer.write(buffer)
            await self._writer.drain()

    async def aclose(self) -> None:
        # No wait for the peer (httpcore closes inside shielded scopes and on the pool's release
        # path, where a peer that never acknowledges must not hold it), but one turn of the loop,
        # as anyio gives, so the socket is closed now and not whenever the caller next yields; then
        # abort, so unsent bytes cannot keep it open either.
        transport = self._writer.transport
        if not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)
        transport.abort()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        async with _within(timeout, httpcore2.ConnectTimeout, httpcore2.ConnectError):
            await self._writer.start_tls(ssl_context, server_hostname=server_hostname, ssl_handshake_timeout=timeout)
        return self

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            # An idle HTTP/1.1 connection has nothing to read unless the server closed it or
            # broke it: asyncio has already moved whatever arrived into the reader.
            return self._reader.at_eof() or self._reader.exception() is not None
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        return None


def _apply(sock: socket.socket | None, options: Iterable[_Option] | None) -> None:
    if sock is None or not options:
        return
    for option in options:
        sock.setsockopt(*option)


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend over asyncio streams (httpcore's anyio backend off asyncio)."""

    def __init__(self) -> None:
        self._fallback = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[_Option] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        if sniffio.current_async_library() != "asyncio":
            return await self._fallback.connect_tcp(host, port, timeout, local_address, socket_options)
        local = (local_address, 0) if local_address is not None else None
        async with _within(timeout, httpcore2.ConnectTimeout, httpcore2.ConnectError):
            reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        _apply(writer.get_extra_info("socket"), socket_options)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[_Option] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        if sniffio.current_async_library() != "asyncio":
            return await self._fallback.connect_unix_socket(path, timeout, socket_options)
        async with _within(timeout, httpcore2.ConnectTimeout, httpcore2.ConnectError):
            reader, writer = await asyncio.open_unix_connection(path)
        _apply(writer.get_extra_info("socket"), socket_options)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        if sniffio.current_async_library() != "asyncio":
            await self._fallback.sleep(seconds)
        else:
            await asyncio.sleep(seconds)


def fast_transport(limits: httpx2.Limits, *, verify: ssl.SSLContext | str | bool = True) -> httpx2.AsyncHTTPTransport:
    """An ``httpx2.AsyncHTTPTransport`` (its error mapping and response streams) over ``AsyncioBackend``."""
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)
    # httpx2 takes no network backend, so the pool it built is replaced by the same pool over
    # ours. Proxies from the environment are the client's mounts, not this transport's.
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(verify=verify, trust_env=True),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=AsyncioBackend(),
    )
    return transport
