"""The engines' transports against real loopback servers: reuse, a server's close, timeouts, TLS.

Both the aiohttp transport the jev engine sends through and the asyncio-streams one it used before
(kept for ``bench/jev_client.py``'s comparison) must behave as httpx2's own does.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest

from fastslow.engines._aiohttp_net import AiohttpTransport, aiohttp_transport
from fastslow.engines._asyncio_net import fast_transport
from fastslow.engines.jev import JevEngine
from fastslow.router.settings import JevSettings

LIMITS = httpx2.Limits(max_connections=4, max_keepalive_connections=4, keepalive_expiry=30.0)
Transport = Callable[..., httpx2.AsyncBaseTransport]
TRANSPORTS = pytest.mark.parametrize("transport", [aiohttp_transport, fast_transport], ids=["aiohttp", "asyncio"])
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Loopback:
    """A bare HTTP/1.1 server on loopback; counts the connections it accepted."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's body, or ``None`` when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


def reply(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


@asynccontextmanager
async def loopback(handler: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[Loopback]:
    state = Loopback()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    async with server:
        yield state


def request_lines(seen: list[bytes], body: bytes = b"{}") -> Handler:
    """A handler that records each request's first line in ``seen`` and answers ``body``."""

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        writer.write(reply(body))
        await writer.drain()

    return record


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (body := await read_request(reader)) is not None:
        writer.write(reply(body))
        await writer.drain()


@TRANSPORTS
async def test_requests_in_turn_share_one_kept_alive_connection(transport: Transport) -> None:
    async with loopback(echo_forever) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        for n in range(3):
            response = await client.post(f"http://127.0.0.1:{server.port}/", content=b'{"n": %d}' % n)
            assert response.status_code == 200 and response.json() == {"n": n}
    assert server.connections == 1


@TRANSPORTS
async def test_concurrent_requests_each_get_an_answer_on_up_to_the_pool_s_connections(transport: Transport) -> None:
    async with loopback(echo_forever) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        answers = await asyncio.gather(*(client.post(url, content=b"[%d]" % n) for n in range(20)))
    assert [a.json() for a in answers] == [[n] for n in range(20)]
    assert 1 <= server.connections <= LIMITS.max_connections


@TRANSPORTS
async def test_a_connection_the_server_closed_while_idle_is_not_reused(transport: Transport) -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        writer.write(reply(body or b"{}"))  # keep-alive implied, then the server hangs up anyway
        await writer.drain()

    async with loopback(once) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        assert (await client.post(url, content=b"{}")).status_code == 200
        await asyncio.sleep(0.1)  # the close reaches the client's reader as end of file
        # Reusing the closed connection would fail: "server disconnected without sending a response".
        assert (await client.post(url, content=b"[1]")).json() == [1]
    assert server.connections == 2


@TRANSPORTS
async def test_a_server_that_never_answers_is_a_read_timeout(transport: Transport) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async with loopback(silent) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        with pytest.raises(httpx2.ReadTimeout):
            await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}", timeout=0.2)


@TRANSPORTS
async def test_nobody_listening_is_a_connect_error(transport: Transport) -> None:
    async with loopback(echo_forever) as server:
        port = server.port
    async with httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        with pytest.raises(httpx2.ConnectError):
            await client.post(f"http://127.0.0.1:{port}/", content=b"{}")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a certificate for the TLS test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@TRANSPORTS
async def test_https_goes_through_start_tls_and_checks_the_certificate(
    certificate: tuple[Path, Path], transport: Transport
) -> None:
    cert, key = certificate
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))
    async with loopback(echo_forever, tls=served) as server:
        url = f"https://127.0.0.1:{server.port}/"
        async with httpx2.AsyncClient(transport=transport(LIMITS, verify=trusted)) as client:
            assert (await client.post(url, content=b'{"tls": true}')).json() == {"tls": True}
        async with httpx2.AsyncClient(transport=transport(LIMITS)) as client:
            with pytest.raises(httpx2.ConnectError):  # the system's roots do not know this certificate
                await client.post(url, content=b"{}")


async def test_the_jev_engine_s_own_client_sends_through_aiohttp() -> None:
    engine = JevEngine(JevSettings(base_url="http://127.0.0.1:9"))
    try:
        assert isinstance(engine._client._transport, AiohttpTransport)  # type: ignore[attr-defined]
    finally:
        await engine.aclose()


@TRANSPORTS
async def test_a_reply_cut_short_is_a_protocol_error(transport: Transport) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"half')
        await writer.drain()

    async with loopback(cut) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")


@TRANSPORTS
async def test_a_compressed_reply_is_decoded_once_by_httpx2(transport: Transport) -> None:
    body = gzip.compress(b'{"zipped": true}')

    async def zipped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async with loopback(zipped) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        response = await client.post(f"http://127.0.0.1:{server.port}/", content=b"{}")
    assert response.json() == {"zipped": True} and response.num_bytes_downloaded == len(body)


async def test_the_aiohttp_transport_takes_its_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    async with loopback(request_lines(seen, b'{"via": "proxy"}')) as server:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with httpx2.AsyncClient(transport=aiohttp_transport(LIMITS)) as client:
            response = await client.post("http://system-one.invalid/v1/systemone", content=b"{}")
    assert response.json() == {"via": "proxy"}
    assert seen == [b"POST http://system-one.invalid/v1/systemone HTTP/1.1"]


def test_the_aiohttp_transport_serves_one_event_loop_after_another() -> None:
    transport = aiohttp_transport(LIMITS)

    async def once(n: int) -> object:
        async with loopback(echo_forever) as server:
            client = httpx2.AsyncClient(transport=transport)
            return (await client.post(f"http://127.0.0.1:{server.port}/", content=b"[%d]" % n)).json()

    # A session is bound to its loop: the second run must open its own rather than fail on the first's.
    assert asyncio.run(once(1)) == [1]
    assert asyncio.run(once(2)) == [2]
    asyncio.run(transport.aclose())


async def test_the_aiohttp_transport_goes_direct_to_hosts_no_proxy_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there: used, it would fail
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    async with loopback(echo_forever) as server, httpx2.AsyncClient(transport=aiohttp_transport(LIMITS)) as client:
        response = await client.post(f"http://127.0.0.1:{server.port}/", content=b'{"direct": true}')
    assert response.json() == {"direct": True}


@TRANSPORTS
async def test_an_encoded_url_goes_out_as_it_is(transport: Transport) -> None:
    seen: list[bytes] = []
    async with loopback(request_lines(seen)) as server, httpx2.AsyncClient(transport=transport(LIMITS)) as client:
        await client.post(f"http://127.0.0.1:{server.port}/v1/a%2Fb?q=a%20b&r=%C3%A9", content=b"{}")
    assert seen == [b"POST /v1/a%2Fb?q=a%20b&r=%C3%A9 HTTP/1.1"]
