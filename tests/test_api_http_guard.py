"""The HTTP server protects itself: framing, timeouts, sizes and the API key before the body.

Raw sockets against the real server on loopback, with tiny limits from ``ServerSettings``, so a
test sees exactly the bytes and the closes a hostile client would. Every abuse ends with a normal
request on the same server: it is not wedged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn

from fastslow.api._server import _no_delay, server_config
from fastslow.api.app import RateLimit, create_app
from fastslow.api.store import DecisionStore, database_url_for
from fastslow.router import Settings
from fastslow.router.settings import ServerSettings

from fakes.api_server import (
    REPO,
    SEEN_RESPONSES,
    RunningApi,
    api_client,
    create_key,
    new_key,
    running_api,
    test_policy,
    test_settings,
)
from fakes.embedded import child_env

# Wall-clock assertions: kept on one xdist worker (make test), away from each other.
pytestmark = pytest.mark.xdist_group("timing")

HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 0.5
MAX_HEADERS = 4096
MAX_BODY = 4096
LIMIT = RateLimit(requests=3, window_s=3600)
SLACK_S = 1.0
"""How late a timeout may act on a loaded machine; bounds are the timeout plus this."""
DRIP_S = 0.2
CHECK = {"policies": ["tool_safety"], "text": "git: status"}
DECISION = "/v1/decisions/0123456789abcdef0123456789abcdef"


def _settings(tmp_path: Path) -> Settings:
    server = ServerSettings(
        header_timeout_s=HEADER_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        keep_alive_timeout_s=KEEP_ALIVE_S,
        max_header_bytes=MAX_HEADERS,
    )
    return test_settings(tmp_path, max_body_bytes=MAX_BODY, server=server)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(_settings(tmp_path_factory.mktemp("guard")), rate_limit=LIMIT) as running:
        yield running


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/json", self
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


class Conn:
    """One raw HTTP/1.1 connection: send bytes, parse responses, see the close."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        self.url = url
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=timeout)
        self.buffer = b""
        self.opened = time.monotonic()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""  # a reset is a close too, for these tests

    def reply(self) -> Reply:
        """The next response, read whole (its body by Content-Length)."""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self._recv()
            assert chunk, f"the server closed before a response; got {self.buffer!r}"
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            chunk = self._recv()
            assert chunk, "the server closed in the middle of a response body"
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        SEEN_RESPONSES.add_raw("RAW", self.url, status, headers, body)
        return Reply(status, headers, body)

    def rest(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        while chunk := self._recv():
            self.buffer += chunk
        rest, self.buffer = self.buffer, b""
        return rest

    def closed_within(self, seconds: float) -> bool:
        """Whether the server closes the connection, sending nothing more, within ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            return self.rest() == b""
        except TimeoutError:
            return False


@contextmanager
def connect(url: str, *, timeout: float = 10.0) -> Iterator[Conn]:
    conn = Conn(url, timeout=timeout)
    try:
        yield conn
    finally:
        conn.close()


def _request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _serves(api: RunningApi) -> None:
    """A normal authenticated request on a new connection still gets its answer (call it off the event loop)."""
    key = create_key(api.settings, "acme")
    body = json.dumps(CHECK).encode()
    with connect(api.url) as conn:
        conn.send(
            _request(
                "POST",
                "/v1/policy-check",
                f"Authorization: Bearer {key}",
                "Content-Type: application/json",
                f"Content-Length: {len(body)}",
                body=body,
            )
        )
        reply = conn.reply()
    assert reply.status == 200, reply
    assert json.loads(reply.body)["verdict"] in ("allow", "review", "deny")


def _smuggling(key: str) -> bytes:
    # Framed by Content-Length (as a proxy might), the body is the next 36 bytes and nothing follows;
    # framed as chunked (as h11 does), the body ends at "0\r\n\r\n" and a GET follows on its own.
    smuggled = _request("GET", DECISION, f"Authorization: Bearer {key}")
    chunked = b"0\r\n\r\n" + smuggled
    outer = _request(
        "POST",
        "/v1/policy-check",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
        f"Content-Length: {len(chunked)}",
        "Transfer-Encoding: chunked",
    )
    return outer + chunked


async def _not_counted(url: str, key: str) -> None:
    # Neither the refused request nor the smuggled one reached the app: the key's whole rate limit is left.
    async with api_client(url, key) as client:
        statuses = [(await client.get(DECISION)).status_code for _ in range(LIMIT.requests)]
    assert statuses == [404] * LIMIT.requests


async def test_content_length_with_chunked_is_400_and_the_smuggled_request_never_runs(api: RunningApi) -> None:
    key = await api.key("acme")
    with connect(api.url) as conn:
        conn.send(_smuggling(key))
        reply = conn.reply()
        rest = conn.rest()
    assert reply.status == 400
    assert reply.headers["connection"] == "close"
    # Refused by the server's protocol as it parsed the headers, before the app saw anything.
    assert reply.error()["message"].startswith("invalid HTTP request: ")
    assert "Content-Length and Transfer-Encoding" in reply.error()["message"]
    assert rest == b""  # one response, then the close: the GET was never answered
    await _not_counted(api.url, key)
    await asyncio.to_thread(_serves, api)


@contextmanager
def _stock_protocol_api(settings: Settings) -> Iterator[str]:
    """The app under uvicorn's own h11 protocol: only the request guard stands in the way."""
    config = server_config(create_app(settings, rate_limit=LIMIT), settings, log_level="warning", access_log=False)
    config.http = "h11"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="stock-api", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the API server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


async def test_the_guard_refuses_ambiguous_framing_behind_any_protocol(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    key = await new_key(settings, "acme")
    with _stock_protocol_api(settings) as url:
        with connect(url) as conn:
            conn.send(_smuggling(key))
            reply = conn.reply()
            rest = conn.rest()
        await _not_counted(url, key)
    assert reply.status == 400
    assert reply.headers["connection"] == "close"
    assert reply.error()["type"] == "bad_request"
    assert "Content-Length and Transfer-Encoding" in reply.error()["message"]
    assert rest == b""


def test_differing_content_lengths_are_400_and_the_connection_closes(api: RunningApi) -> None:
    with connect(api.url) as conn:
        conn.send(_request("POST", "/v1/policy-check", "Content-Length: 2", "Content-Length: 3", body=b"{}}"))
        reply = conn.reply()
        rest = conn.rest()
    assert reply.status == 400
    assert reply.headers["connection"] == "close"
    assert "Content-Length" in reply.error()["message"]
    assert rest == b""
    _serves(api)


@pytest.mark.parametrize("terminated", [True, False], ids=["whole", "unfinished"])
def test_headers_over_the_limit_are_431_and_the_connection_closes(api: RunningApi, terminated: bool) -> None:
    request = _request("GET", "/healthz", "X-Big: " + "a" * (2 * MAX_HEADERS))
    with connect(api.url) as conn:
        conn.send(request if terminated else request[:-4])
        reply = conn.reply()
        rest = conn.rest()
    assert reply.status == 431
    assert reply.error()["type"] == "headers_too_large"
    assert rest == b""
    _serves(api)


@pytest.mark.parametrize("drip", [True, False], ids=["a-byte-every-0.2s", "nothing"])
def test_a_connection_without_complete_headers_is_closed_after_the_header_timeout(api: RunningApi, drip: bool) -> None:
    with connect(api.url) as conn:
        conn.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " if drip else b"")
        conn.sock.settimeout(DRIP_S)
        closed = False
        got = b""
        while not closed and time.monotonic() - conn.opened < HEADER_TIMEOUT_S + 5:
            try:
                if drip:
                    conn.send(b"a")
                chunk = conn.sock.recv(65536)
                got += chunk
                closed = chunk == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        elapsed = time.monotonic() - conn.opened
    assert closed
    assert got == b""  # closed, not answered
    assert HEADER_TIMEOUT_S - 0.1 <= elapsed <= HEADER_TIMEOUT_S + SLACK_S
    _serves(api)


def test_a_slow_sender_of_a_body_gets_408_within_the_body_timeout(api: RunningApi) -> None:
    key = create_key(api.settings, "acme")
    headers = (f"Authorization: Bearer {key}", "Content-Type: application/json", "Content-Length: 500")
    with connect(api.url) as conn:
        conn.send(_request("POST", "/v1/policy-check", *headers, body=b'{"text": "'))
        started = time.monotonic()
        conn.sock.settimeout(DRIP_S)
        arrived: bytes | None = None  # b"" once the server closed
        while arrived is None and time.monotonic() - started < BODY_TIMEOUT_S + 5:
            try:
                conn.send(b"a")
                arrived = conn.sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                arrived = b""
        elapsed = time.monotonic() - started
        conn.buffer = arrived or b""
        conn.sock.settimeout(10)
        reply = conn.reply() if arrived else None
        closed = conn.closed_within(SLACK_S)
    assert arrived is not None
    assert elapsed <= BODY_TIMEOUT_S + SLACK_S
    assert closed
    if reply is not None:  # the 408 is what a client reading in time sees; a close is all it must see
        assert reply.status == 408
        assert reply.headers["connection"] == "close"
        assert f"{BODY_TIMEOUT_S:g} s" in reply.error()["message"]
    _serves(api)


def test_a_keep_alive_connection_serves_then_closes_when_idle(api: RunningApi) -> None:
    assert KEEP_ALIVE_S + SLACK_S < HEADER_TIMEOUT_S  # so the close below is keep-alive's, not the header clock's
    with connect(api.url) as conn:
        statuses = []
        for _ in range(2):
            conn.send(_request("GET", "/healthz"))
            statuses.append(conn.reply().status)
        closed = conn.closed_within(KEEP_ALIVE_S + SLACK_S)
    assert statuses == [200, 200]
    assert closed


def test_an_over_limit_content_length_gets_its_413_at_once_without_a_body(api: RunningApi) -> None:
    with connect(api.url, timeout=2.0) as conn:  # within 2 s, or the read fails
        conn.send(
            _request("POST", "/v1/policy-check", "Content-Type: application/json", f"Content-Length: {MAX_BODY * 10}")
        )
        reply = conn.reply()
        conn.sock.settimeout(10)
        rest = conn.rest()
    assert reply.status == 413
    assert reply.headers["connection"] == "close"
    assert reply.error()["type"] == "payload_too_large"
    assert str(MAX_BODY) in reply.error()["message"]
    assert rest == b""
    _serves(api)


async def test_a_key_is_checked_before_the_body(api: RunningApi) -> None:
    async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
        revoked, record = await store.create_key("acme", name="leaked")
        await store.revoke_key(record.id)
    invalid = {"content": b"{not json", "headers": {"content-type": "application/json"}}
    async with api_client(api.url) as anyone, api_client(api.url, "fs_unknown") as stranger:
        missing = await anyone.post("/v1/policy-check", **invalid)
        unknown = await stranger.post("/v1/policy-check", **invalid)
        unknown_path = await anyone.get("/v1/nothing-here")
    async with api_client(api.url, revoked) as client:
        gone = await client.post("/v1/policy-check", **invalid)
    for response in (missing, unknown, unknown_path):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "unauthorized"
    assert gone.status_code == 403
    assert "revoked" in gone.json()["error"]["message"]


async def test_requests_with_invalid_bodies_count_against_the_rate_limit(api: RunningApi) -> None:
    key = await api.key("acme")
    async with api_client(api.url, key) as client:
        invalid = [
            await client.post("/v1/policy-check", content=b"{not json", headers={"content-type": "application/json"})
            for _ in range(LIMIT.requests)
        ]
        limited = await client.post("/v1/policy-check", json=CHECK)
    assert [r.status_code for r in invalid] == [422] * LIMIT.requests
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["retry-after"]) <= LIMIT.window_s
    await asyncio.to_thread(_serves, api)


def test_the_openapi_document_still_declares_the_bearer_scheme(api: RunningApi) -> None:
    with connect(api.url) as conn:
        conn.send(_request("GET", "/openapi.json"))
        schema = json.loads(conn.reply().body)
    assert "ApiKey" in schema["components"]["securitySchemes"]
    assert {"ApiKey": []} in schema["paths"]["/v1/policy-check"]["post"]["security"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.slow
def test_fastslow_serve_runs_the_same_protections(tmp_path: Path) -> None:
    env = child_env(
        FASTSLOW_DATA_DIR=str(tmp_path / "data"),
        FASTSLOW_POLICY_FILE=str(test_policy(tmp_path)),
        FASTSLOW_SETTINGS_FILE=str(tmp_path / "none.toml"),
        FASTSLOW_SERVER__HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "fastslow.api.cli", "serve", "--port", str(port), "--log-level", "warning"]
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            with contextlib.suppress(OSError), connect(url, timeout=1.0) as conn:
                conn.send(_request("GET", "/healthz"))
                if conn.reply().status == 200:
                    break
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        with connect(url) as conn:
            conn.send(_smuggling("fs_anything"))
            framing = conn.reply()
            after_framing = conn.rest()
        with connect(url) as conn:
            idle_closed = conn.closed_within(HEADER_TIMEOUT_S + SLACK_S)
    finally:
        process.kill()
        process.wait(timeout=30)
    assert framing.status == 400
    assert framing.error()["message"].startswith("invalid HTTP request: ")
    assert after_framing == b""
    assert idle_closed


def test_a_refusal_before_the_body_leaves_the_connection_usable(api: RunningApi) -> None:
    body = b'{"policies": ["tool_safety"], "text": "unread"}'
    with connect(api.url) as conn:
        conn.send(_request("POST", "/v1/policy-check", f"Content-Length: {len(body)}", body=body))
        refused = conn.reply()
        conn.send(_request("GET", "/healthz"))  # the unread body was skipped, not taken for this request
        after = conn.reply()
    assert refused.status == 401
    assert "connection" not in refused.headers
    assert after.status == 200


async def test_a_connection_accepted_from_a_socket_uvicorn_bound_sends_without_nagles_delay() -> None:
    # uvicorn binds the socket its workers share as socket.socket(family): proto 0, on which asyncio
    # leaves Nagle's algorithm on for every accepted connection (about 40 ms a response, measured).
    listener = socket.socket(socket.AF_INET)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[tuple[int, int]] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            before = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            _no_delay(transport)
            seen.set_result((before, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
            transport.close()

    server = await loop.create_server(Probe, sock=listener)
    try:
        _reader, writer = await asyncio.open_connection(*listener.getsockname())
        assert await asyncio.wait_for(seen, 10) == (0, 1)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
