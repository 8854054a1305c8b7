"""What the fake SDK servers share: a real HTTP server on loopback, answering one route from a script.

``openai_server``, ``anthropic_server`` and ``responses_server`` each subclass ``SdkServer`` with
their wire: the route, the reply type, and how a reply becomes a body (built from that SDK's own
types) or an error in that provider's shape. This module holds the rest, the same for all three:

* replies come from the script in order, or from ``respond(request_body)``; once the script runs
  out, every request gets the wire's 500;
* every request body is recorded (``server.requests``), and its headers with lower-case names
  (``server.headers``);
* a reply's ``delay_s`` holds it back; a test that ends meanwhile sends it nowhere;
* a reply whose ``http_status`` is not 200 is an error, in the wire's body shape; its ``headers``
  go out with it, ``_`` written ``-`` (``retry_after="3"``);
* ``server.running()`` serves in a thread and yields the base URL, shutting down on exit.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

__all__ = ["ScriptedReply", "SdkServer"]


class ScriptedReply(Protocol):
    """What the scaffolding reads of every wire's reply type."""

    @property
    def http_status(self) -> int: ...
    @property
    def message(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def delay_s(self) -> float: ...


R = TypeVar("R", bound=ScriptedReply)


class SdkServer(ThreadingHTTPServer, ABC, Generic[R]):
    """The server: replies come from ``script`` in order, or from ``respond(request_body)``."""

    daemon_threads = True
    route: ClassVar[str]
    """The one path answered (any query string aside); others get the wire's 404."""
    base_path: ClassVar[str] = ""
    """What the base URL ``running()`` yields ends in, as the SDK wants it (``/v1``, or nothing)."""
    thread_name: ClassVar[str]

    def __init__(self, script: list[R], respond: Callable[[dict[str, Any]], R] | None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        """Every request body, in order."""
        self.headers: list[dict[str, str]] = []
        """The headers of each request (lower-case names), in order."""
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    @abstractmethod
    def exhausted(self) -> R:
        """The reply once the script has run out."""

    @abstractmethod
    def error_body(self, status: int, message: str, *, scripted: bool) -> Any:
        """The wire's error body: a scripted error's, or (``scripted=False``) the 404 for another path."""

    @abstractmethod
    def body(self, reply: R, number: int) -> Any:
        """The success body for the ``number``-th request (from 1)."""

    def next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[R, int]:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            number = len(self.requests)
            if self.respond is not None:
                return self.respond(body), number
            if not self.script:
                return self.exhausted(), number
            return self.script.pop(0), number

    @contextmanager
    def running(self) -> Iterator[tuple[str, Self]]:
        """Serve in a thread; yields (base URL, this server) and shuts down on exit."""
        thread = threading.Thread(target=self.serve_forever, args=(0.02,), name=self.thread_name, daemon=True)
        thread.start()
        try:
            host, port = self.server_address[:2]
            yield f"http://{host!s}:{port}{self.base_path}", self
        finally:
            self.stopping.set()
            self.shutdown()
            self.server_close()
            thread.join()


class _Handler(BaseHTTPRequestHandler):
    server: SdkServer[Any]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.split("?")[0].rstrip("/") != self.server.route:
            self._send(404, self.server.error_body(404, f"no route {self.path}", scripted=False))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply, number = self.server.next_reply(body, headers)
        if reply.delay_s and self.server.stopping.wait(reply.delay_s):
            return  # the test is over; nobody waits for this reply
        if reply.http_status != 200:
            payload = self.server.error_body(reply.http_status, reply.message, scripted=True)
            self._send(reply.http_status, payload, reply.headers)
            return
        self._send(200, self.server.body(reply, number))

    def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        del format, args  # keep test output quiet
