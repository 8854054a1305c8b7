"""An ``httpx2`` transport that sends through aiohttp's client, for the System-1 engines' async path.

Measured against fastslow's own ``httpx2`` path (``bench/jev_client.py``: the same Jev request to
the same stub, the client on its own core), aiohttp's client, with its C HTTP parser, cost a third
of the CPU per exchange. Everything above the socket that fastslow relies on stays ``httpx2``'s:
the engines build ``httpx2`` requests, read ``httpx2`` responses under the reply cap, retry, time
out, put the trace context on the headers and map errors exactly as before. Only the exchange
itself (connection pooling, keep-alive, TLS, HTTP/1.1 framing, proxies) is aiohttp's, and its
errors come back as the ``httpx2`` errors httpcore would have raised:

* cannot connect (refused, unresolvable, a TLS handshake or certificate refused, a proxy) ->
  ``httpx2.ConnectError``, ``ConnectTimeout`` when the connect or the pool timed out;
* a read timed out -> ``httpx2.ReadTimeout``;
* the server closed or broke the reply -> ``httpx2.RemoteProtocolError``, or ``ReadError`` when
  the connection itself failed.

Bodies are passed through undecoded (aiohttp's ``auto_decompress`` off): ``httpx2`` decodes them as
it always has, under the same cap. TLS uses the same ``ssl.SSLContext`` as before
(``httpx2.create_ssl_context``: the same CA bundle and ``SSL_CERT_FILE`` handling). A session
belongs to one event loop: the transport opens one on the loop of its first request and another
if it is later used on a different loop.

Proxies come from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``), read
when the transport is made, as an ``httpx2`` client reads them for its default transport. (An
``httpx2`` client given its own transport, as the engines' was, reads no proxy from the
environment at all.) Which proxy a host goes through is worked out once per scheme and host, not
per request as aiohttp's ``trust_env`` does: that lookup cost more CPU than the rest of an exchange
(about 0.8 ms against 0.4 ms in ``bench/jev_client.py``).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import yarl

__all__ = ["AiohttpTransport", "aiohttp_transport"]

_CHUNK = 64 * 1024


def _timeouts(request: httpx2.Request) -> aiohttp.ClientTimeout:
    """httpx2's per-phase timeouts as aiohttp's (no total: the engines bound the whole exchange)."""
    given: dict[str, Any] = request.extensions.get("timeout", {})
    return aiohttp.ClientTimeout(
        total=None, sock_connect=given.get("connect"), sock_read=given.get("read"), connect=given.get("pool")
    )


def _mapped(exc: BaseException, request: httpx2.Request) -> httpx2.TransportError:
    """The httpx2 error for aiohttp's ``exc`` (module docstring)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(message, request=request)
    if isinstance(exc, TimeoutError):  # aiohttp's socket read timeouts are TimeoutErrors too
        return httpx2.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unresolvable, TLS handshake or proxy
        return httpx2.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return httpx2.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return httpx2.ReadError(message, request=request)
    return httpx2.RemoteProtocolError(message, request=request)


class _Body(httpx2.AsyncByteStream):
    """A reply body read chunk by chunk; closing it before the end closes its connection."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(_CHUNK):
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc, self._request) from exc

    async def aclose(self) -> None:
        # A body read to the end returns its connection to the pool; one cut short must not be reused.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
            # asyncio closes a transport's socket on the loop's next turn: take it here, so the
            # connection is gone (the server sees it) by the time the caller goes on.
            await asyncio.sleep(0)


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """``httpx2.AsyncBaseTransport`` over ``aiohttp.ClientSession`` (see the module docstring).

    Args:
        limits: the pool's size and keep-alive expiry, as for ``httpx2.AsyncHTTPTransport``.
        verify: ``True`` (the default CA bundle), a CA bundle path, ``False`` or an ``ssl.SSLContext``.
    """

    def __init__(self, limits: httpx2.Limits, *, verify: ssl.SSLContext | str | bool = True) -> None:
        self._limits = limits
        self._ssl = httpx2.create_ssl_context(verify=verify, trust_env=True)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._env_proxies = urllib.request.getproxies_environment()
        self._proxies: dict[tuple[str, str], str | None] = {}

    def _proxy_for(self, url: httpx2.URL) -> str | None:
        """The environment's proxy for ``url``'s scheme and host, or ``None`` (none set, or ``NO_PROXY``)."""
        key = (url.scheme, url.host)
        if key not in self._proxies:
            proxies = self._env_proxies
            bypass = not proxies or bool(urllib.request.proxy_bypass(url.host))
            self._proxies[key] = None if bypass else proxies.get(url.scheme) or proxies.get("all")
        return self._proxies[key]

    async def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop and self._loop is not None and self._loop.is_closed():
            # The first loop has ended (asyncio.run returned): its session cannot be used here, and
            # closing it only marks it closed (its loop's sockets went with the loop).
            await self._session.close()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections or 0,
                limit_per_host=0,
                keepalive_timeout=self._limits.keepalive_expiry or 15.0,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False, skip_auto_headers=("User-Agent",)
            )
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = await self._session_here()
        try:
            content = request.content
        except httpx2.RequestNotRead:  # a streamed body: the engines send bytes, but a caller may not
            content = await request.aread()
        try:
            response = await session.request(
                request.method,
                # Already encoded by httpx2: yarl must not quote it again.
                yarl.URL(str(request.url), encoded=True),
                data=content,
                headers=request.headers.multi_items(),
                allow_redirects=False,
                timeout=_timeouts(request),
                proxy=self._proxy_for(request.url),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc, request) from exc
        return httpx2.Response(
            status_code=response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            stream=_Body(response, request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode("latin-1")},
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def aiohttp_transport(limits: httpx2.Limits, *, verify: ssl.SSLContext | str | bool = True) -> AiohttpTransport:
    """The engines' async transport: aiohttp's client under httpx2's requests and responses."""
    return AiohttpTransport(limits, verify=verify)
