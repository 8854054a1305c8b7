"""The uvicorn configuration ``fastslow serve`` and the tests run the API under, and its HTTP protocol.

``server_config(app, settings)`` is the one place the server's protections are set, so the tests
exercise exactly what production runs:

* an idle keep-alive connection is closed after ``server.keep_alive_timeout_s`` (uvicorn's own timer);
* a request's line and headers may take ``server.max_header_bytes`` at most: larger is a 431 and the
  connection is closed (h11 bounds what it buffers; ``GuardedConnection`` also measures a header
  block that arrived whole, which h11 lets through);
* a connection must deliver a request's complete headers within ``server.header_timeout_s`` of being
  made, or of the previous response on a keep-alive connection, or it is closed (slow-loris);
* a request framed two ways (``Content-Length`` and ``Transfer-Encoding``, or differing
  ``Content-Length`` values) is a 400 and the connection is closed, so bytes a proxy in front may
  have framed differently are never run as a second request (request smuggling).

The body's limits (size, ``server.body_timeout_s``) are the app's: ``fastslow.api.app``'s request guard.

``GuardedH11Protocol`` subclasses uvicorn's ``H11Protocol`` and relies on its internals: the
``conn`` attribute made in ``__init__`` (and handed to each request cycle), ``handle_events``
answering an ``h11.RemoteProtocolError`` through ``send_400_response``, ``connection_made``,
``connection_lost`` and ``on_response_complete``. It was written against uvicorn 0.54.0; those
members read the same from 0.40.0 on (compared in uvicorn's history), and the tests passed on 0.40.0
and pass on 0.54.0. ``pyproject.toml`` pins 0.53 to 0.54: ``fastslow serve --workers`` calls the
supervisor as 0.53 reshaped it (``Multiprocess(config, sockets)``). Check both again before widening it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http
import socket
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from fastslow.router import Settings
from fastslow.router.settings import ServerSettings

from .app import ErrorBody, ErrorDetail

__all__ = [
    "GuardedConfig",
    "GuardedConnection",
    "GuardedH11Protocol",
    "Server",
    "freeze_started_heap",
    "server_config",
]

_OURS = ("http", "ws", "lifespan", "timeout_keep_alive", "h11_max_incomplete_event_size", "proxy_headers")
_KINDS = {400: "bad_request", 431: "headers_too_large", 501: "not_implemented"}
# h11's default when a config sets no limit (uvicorn falls back to the same number).
_H11_DEFAULT_MAX_INCOMPLETE = 16 * 1024
_DEFAULT_HEADER_TIMEOUT_S = ServerSettings().header_timeout_s


def _framing_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    lengths = {part.strip() for name, value in headers if name == b"content-length" for part in value.split(b",")}
    if len(lengths) > 1:
        return "the request has differing Content-Length values"
    if lengths and any(name == b"transfer-encoding" for name, _ in headers):
        return "the request has both Content-Length and Transfer-Encoding; send one"
    return None


def _head_size(event: h11.Request) -> int:
    # The request line and each header line as sent, CRLFs included (h11 keeps the raw names).
    line = len(event.method) + len(event.target) + len(b"HTTP/") + len(event.http_version) + 4
    return line + sum(len(name) + len(value) + 4 for name, value in event.headers.raw_items()) + 2


def _no_delay(transport: asyncio.BaseTransport) -> None:
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and a socket accepted
    # from one uvicorn made with socket.socket(family) (``fastslow serve --workers``, whose workers
    # share the supervisor's socket) has proto 0: a response written in two parts then waited for
    # the client's delayed ACK, about 40 ms a request (bench/workers.py: 72 ms against 25 at one caller).
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class GuardedConnection(h11.Connection):
    """An ``h11.Connection`` (server side) that refuses ambiguous framing and oversized headers.

    h11 reads a request with both ``Content-Length`` and ``Transfer-Encoding`` as chunked and keeps
    both headers in the ``Request``: a proxy that framed it by ``Content-Length`` would then see
    the rest of the chunked body as the next request. Refusing it here, where the request is parsed,
    means uvicorn answers 400 and closes before any of its body is read as anything.

    Args:
        max_header_bytes: the largest request line plus headers, also h11's buffering limit.
        on_request: called each time a request's headers are complete.
    """

    def __init__(self, *, max_header_bytes: int, on_request: Callable[[], None]) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self._max_header_bytes = max_header_bytes
        self._on_request = on_request
        self.refusal: h11.RemoteProtocolError | None = None
        """Why the peer's last request was refused, for the error response."""

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """h11's next event; ``h11.RemoteProtocolError`` for a request this server will not read."""
        if self.refusal is not None:  # h11 marks its own errors so; ours leave its state alone
            raise h11.RemoteProtocolError("the connection refused an earlier request")
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                problem = _framing_problem(list(event.headers))
                if problem is not None:
                    raise h11.RemoteProtocolError(problem)
                if _head_size(event) > self._max_header_bytes:
                    raise h11.RemoteProtocolError(
                        f"the request line and headers are larger than {self._max_header_bytes} bytes",
                        error_status_hint=431,
                    )
                self._on_request()
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise
        return event


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with the header timeout ``GuardedH11Protocol`` enforces.

    The timeout travels in the configuration, not in a protocol class made per setting, so that
    ``fastslow serve --workers N`` can hand it to worker processes: uvicorn pickles its
    configuration into each one, and a class made inside a function cannot be pickled.

    Args:
        app: the ASGI app, or for worker processes an import string (``"package.module:factory"``).
        header_timeout_s: seconds a connection has to deliver a request's complete headers.
        **kwargs: ``uvicorn.Config``'s other options.
    """

    def __init__(self, app: Any, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and ``GuardedConnection``'s refusals.

    The header timeout is ``GuardedConfig.header_timeout_s`` (``server_config`` makes one); under a
    plain ``uvicorn.Config`` it is ``server.header_timeout_s``'s default.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._header_timeout_s = (
            config.header_timeout_s if isinstance(config, GuardedConfig) else _DEFAULT_HEADER_TIMEOUT_S
        )
        limit = config.h11_max_incomplete_event_size or _H11_DEFAULT_MAX_INCOMPLETE
        # Replaced before the connection is made: uvicorn hands self.conn to each request cycle.
        self.conn = GuardedConnection(max_header_bytes=limit, on_request=self._headers_complete)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Send without Nagle's delay, and start the clock on the first request's headers."""
        _no_delay(transport)
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the header clock with the connection."""
        self._disarm_header_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        """Start the clock on the next request's headers, then let uvicorn arm keep-alive."""
        # Armed first: uvicorn may parse a pipelined request right away, which disarms it again.
        if not self.transport.is_closing():
            self._arm_header_timer()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """Answer a refused request with fastslow's JSON error (400, 431 or 501) and close."""
        refusal = self.conn.refusal if isinstance(self.conn, GuardedConnection) else None
        status = refusal.error_status_hint if refusal is not None and refusal.error_status_hint in _KINDS else 400
        message = f"invalid HTTP request: {refusal}" if refusal is not None and str(refusal) else msg
        body = ErrorBody(error=ErrorDetail(type=_KINDS[status], message=message)).model_dump_json().encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"connection", b"close"),
        ]
        # A response already under way (the error came mid-body) cannot be replaced: just close.
        with contextlib.suppress(h11.LocalProtocolError):
            reason = http.HTTPStatus(status).phrase.encode("ascii")
            output = self.conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
            output += self.conn.send(h11.Data(data=body))
            output += self.conn.send(h11.EndOfMessage())
            self.transport.write(output)
        self.transport.close()

    def _headers_complete(self) -> None:
        self._disarm_header_timer()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        self.logger.debug("closing a connection that sent no complete request headers in %s s", self._header_timeout_s)
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def freeze_started_heap() -> None:
    """Move what is alive once the app has started out of the garbage collector's full sweeps.

    Startup leaves a large, long-lived heap (the app, its policy, the engines and what they
    imported), and every full collection walked all of it again: about a tenth of a stubbed
    policy check's CPU time (``py-spy``). ``gc.freeze()`` moves what is alive then to the permanent
    generation; what requests allocate is collected as before.
    """
    gc.collect()
    gc.freeze()


class Server(uvicorn.Server):
    """uvicorn's server, with the heap it started with frozen (``freeze_started_heap``)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            freeze_started_heap()


def server_config(
    app: Callable[..., Any] | str,
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str | None = "info",
    **uvicorn_kw: Any,
) -> GuardedConfig:
    """The uvicorn configuration the API runs under, with ``settings.server``'s protections.

    Args:
        app: the ASGI app (``create_app(settings)``), or an import string with ``factory=True``.
        settings: fastslow's settings; ``settings.server`` sets the connection limits.
        host: interface to listen on.
        port: TCP port to listen on.
        log_level: uvicorn's log level.
        **uvicorn_kw: more ``uvicorn.Config`` options (``access_log=False``, ...); not the ones set here.

    Returns:
        The configuration, for ``uvicorn.Server``.

    Raises:
        ValueError: ``uvicorn_kw`` names an option this function sets.
    """
    taken = sorted(set(uvicorn_kw) & set(_OURS))
    if taken:
        raise ValueError(f"server_config sets {', '.join(taken)} itself")
    server = settings.server
    return GuardedConfig(
        app,
        header_timeout_s=server.header_timeout_s,
        host=host,
        port=port,
        log_level=log_level,
        http=GuardedH11Protocol,
        ws="none",  # no websocket route, and no websocket library imported
        lifespan="on",
        # uvicorn annotates an int, but only hands it to loop.call_later, which takes seconds as a float.
        timeout_keep_alive=server.keep_alive_timeout_s,
        h11_max_incomplete_event_size=server.max_header_bytes,
        # The client's address is the peer's, or what a proxy in auth_throttle.trusted_proxies says
        # (api/app/_throttle.py): uvicorn's own reading of X-Forwarded-For (trusting 127.0.0.1 by
        # default) would let any local process pick the address the throttle counts.
        proxy_headers=False,
        **uvicorn_kw,
    )
