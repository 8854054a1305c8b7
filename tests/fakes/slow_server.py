"""A raw-socket HTTP/1.1 server on loopback that misbehaves on purpose: it trickles or floods its replies.

Written on bare sockets, not ``http.server``, so every byte's timing and framing is the test's:

* ``normal``: the reply at once, with ``Content-Length`` (gzip-encoded with ``gzip=True``);
* ``trickle``: status and headers at once, then the body one byte every 0.1-0.3 s, each byte well
  within any per-read timeout, so only a deadline on the whole exchange stops the client;
* ``oversized``: a 30 MB body declared in ``Content-Length``;
* ``oversized-chunked``: a 30 MB body in 64 KiB chunks, with no length declared;
* ``oversized-gzip``: 30 MB of JSON gzip-encoded into about 30 KB (a decompression bomb).

``mode`` serves every request; ``script(*modes)`` queues modes for the next requests, in order of arrival.

Reply bodies come from ``respond(path, request_body)``; ``from_handler`` adapts the computing fakes
of ``fakes.openai_fakes`` (bodies built from the SDK's own types). Connections are kept alive
between requests. ``hung_up`` is set when a client closes a connection before its reply is sent
whole (``hung_up_modes`` says in which modes), which is how a test sees that a client dropped a
half-read reply instead of pooling it.
"""

from __future__ import annotations

import gzip
import http
import random
import socket
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Literal

import httpx2

__all__ = ["OVERSIZED_BYTES", "Mode", "Received", "Respond", "SlowServer", "from_handler", "running_slow_server"]

Mode = Literal["normal", "trickle", "oversized", "oversized-chunked", "oversized-gzip"]
Respond = Callable[[str, bytes], tuple[int, bytes]]
"""(request path, request body) -> (status, JSON reply body)."""

OVERSIZED_BYTES = 30 * 1024 * 1024
_BLOCK = 64 * 1024
_FILLER = b"x" * _BLOCK
_HEAD, _TAIL = b'{"padding": "', b'"}'


def from_handler(handler: Callable[[httpx2.Request], httpx2.Response]) -> Respond:
    """A ``Respond`` from an ``httpx2.MockTransport`` handler (``FakeDecisionsServer()``, ...)."""

    def respond(path: str, body: bytes) -> tuple[int, bytes]:
        response = handler(httpx2.Request("POST", f"http://fake.test{path}", content=body))
        return response.status_code, response.content

    return respond


def _oversized_blocks() -> Iterator[bytes]:
    """``OVERSIZED_BYTES`` of JSON, one 64 KiB block at a time (never all in memory)."""
    yield _HEAD
    left = OVERSIZED_BYTES - len(_HEAD) - len(_TAIL)
    while left > 0:
        yield _FILLER[: min(left, _BLOCK)]
        left -= _BLOCK
    yield _TAIL


@cache
def _oversized_gzip() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip container
    return b"".join([*(packer.compress(block) for block in _oversized_blocks()), packer.flush()])


@dataclass(frozen=True)
class Received:
    """One request the server read."""

    path: str
    body: bytes
    client_port: int


class SlowServer:
    """The server; use ``running_slow_server``. ``mode`` may be changed between requests."""

    def __init__(
        self,
        respond: Respond,
        *,
        mode: Mode = "normal",
        gzip: bool = False,
        trickle_s: tuple[float, float] = (0.1, 0.3),
    ) -> None:
        self.respond = respond
        self.mode: Mode = mode
        self.gzip = gzip
        self.trickle_s = trickle_s
        self.requests: list[Received] = []
        self.hung_up = threading.Event()
        self.hung_up_modes: list[Mode] = []
        self._script: deque[Mode] = deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.05)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def script(self, *modes: Mode) -> None:
        """Serve the next requests in these modes, then ``mode`` again."""
        with self._lock:
            self._script.extend(modes)

    def start(self) -> None:
        thread = threading.Thread(target=self._accept, name="slow-server", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the client
        for thread in list(self._threads):
            thread.join(timeout=5)
        self._listener.close()

    # --- serving -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.add(conn)
            thread = threading.Thread(target=self._serve, args=(conn, address[1]), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, port: int) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                while not self._stop.is_set():
                    request_line = reader.readline()
                    if not request_line.strip():
                        return  # the client closed a kept-alive connection
                    headers: dict[str, str] = {}
                    for line in iter(reader.readline, b""):
                        if line in (b"\r\n", b"\n"):
                            break
                        name, _, value = line.decode("latin-1").partition(":")
                        headers[name.strip().lower()] = value.strip()
                    body = reader.read(int(headers.get("content-length") or 0))
                    path = request_line.split()[1].decode()
                    with self._lock:
                        self.requests.append(Received(path=path, body=body, client_port=port))
                        mode = self._script.popleft() if self._script else self.mode
                    try:
                        self._reply(conn, mode, path, body)
                    except OSError:
                        with self._lock:
                            self.hung_up_modes.append(mode)
                        self.hung_up.set()
                        return
        except OSError:
            return  # shut down by stop()
        finally:
            with self._lock:
                self._connections.discard(conn)

    def _reply(self, conn: socket.socket, mode: Mode, path: str, request: bytes) -> None:
        if mode == "oversized":
            conn.sendall(_head(200, {"Content-Length": str(OVERSIZED_BYTES)}))
            for block in _oversized_blocks():
                conn.sendall(block)
            return
        if mode == "oversized-chunked":
            conn.sendall(_head(200, {"Transfer-Encoding": "chunked"}))
            for block in _oversized_blocks():
                conn.sendall(b"%x\r\n%b\r\n" % (len(block), block))
            conn.sendall(b"0\r\n\r\n")
            return
        if mode == "oversized-gzip":
            packed = _oversized_gzip()
            conn.sendall(_head(200, {"Content-Length": str(len(packed)), "Content-Encoding": "gzip"}) + packed)
            return
        status, body = self.respond(path, request)
        extra: dict[str, str] = {}
        if self.gzip:
            body, extra = gzip.compress(body), {"Content-Encoding": "gzip"}
        conn.sendall(_head(status, {"Content-Length": str(len(body)), **extra}))
        if mode == "normal":
            conn.sendall(body)
            return
        for i in range(len(body)):
            conn.sendall(body[i : i + 1])
            if self._stop.wait(random.uniform(*self.trickle_s)):
                return


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@contextmanager
def running_slow_server(
    respond: Respond, *, mode: Mode = "normal", gzip: bool = False, trickle_s: tuple[float, float] = (0.1, 0.3)
) -> Iterator[SlowServer]:
    """A started ``SlowServer`` on 127.0.0.1, stopped on exit."""
    server = SlowServer(respond, mode=mode, gzip=gzip, trickle_s=trickle_s)
    server.start()
    try:
        yield server
    finally:
        server.stop()
