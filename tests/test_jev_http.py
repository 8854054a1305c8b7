"""Retries inside one time budget, Retry-After in all its spellings, and readable error messages."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import pytest

from fastslow.engines.jev import JevEngine, backoff_s, error_message, retry_after_s
from fastslow.router import Answer, EngineHTTPError, EngineTimeout, EngineUnavailable, Noul, ReadOptions
from fastslow.router.settings import JevSettings as Settings

from fakes.jev_replies import ERROR_BODIES, JEV_REPLY
from fakes.jev_server import JevFakeServer, Reply, running_jev_server

QUESTION = {"refund": Noul(instructions="Does the customer ask for a refund?")}
FAST = {"retry-after-ms": "5"}


@pytest.fixture
async def server() -> AsyncIterator[JevFakeServer]:
    async with running_jev_server(None) as running:
        yield running


async def _decide(server: JevFakeServer, *, budget: float = 2.0, retries: int = 2, **kw: Any) -> Any:
    engine = JevEngine(Settings(base_url=server.url, profile="jev", timeout_s=budget, max_retries=retries, **kw))
    try:
        return await engine.decide("Refund me", QUESTION)
    finally:
        await engine.aclose()


# --- helpers -----------------------------------------------------------------------------------


def test_backoff_doubles_from_half_a_second_to_five_with_jitter_below() -> None:
    for retry, nominal in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        for _ in range(20):
            assert nominal * 0.75 <= backoff_s(retry) <= nominal


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "2"}, 2.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_spellings(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers) == expected


def test_retry_after_as_an_http_date() -> None:
    value = retry_after_s({"retry-after": formatdate(time.time() + 30, usegmt=True)})
    assert value is not None and 25 <= value <= 31
    assert retry_after_s({"retry-after": formatdate(time.time() - 30, usegmt=True)}) == 0.0


@pytest.mark.parametrize("name", sorted(ERROR_BODIES))
def test_error_messages_are_readable(name: str) -> None:
    _, body, expected = ERROR_BODIES[name]
    raw = body.encode() if isinstance(body, str) else __import__("json").dumps(body).encode()
    assert expected in error_message(raw)


def test_empty_error_bodies_fall_back_to_the_reason() -> None:
    assert error_message(b"", "Bad Gateway") == "Bad Gateway"
    assert len(error_message(b"x" * 5000)) < 600


# --- against the server ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ERROR_BODIES))
async def test_every_error_shape_reaches_the_caller(server: JevFakeServer, name: str) -> None:
    status, body, expected = ERROR_BODIES[name]
    server.script(*[Reply(status, body, FAST)] * 3)
    with pytest.raises(EngineHTTPError) as err:
        await _decide(server)
    assert err.value.status == status and expected in err.value.body
    assert err.value.engine == "jev:jev" and expected in str(err.value)


async def test_429_with_retry_after_then_success(server: JevFakeServer) -> None:
    server.script(
        Reply(429, {"error": {"message": "slow down", "field": None}}, {"Retry-After": "0.01"}), Reply(200, JEV_REPLY)
    )
    reply = await _decide(server)
    assert isinstance(reply.answers["refund"], Answer)
    assert len(server.requests) == 2


async def test_529_overload_is_retried_with_backoff(server: JevFakeServer) -> None:
    server.script(Reply(529, {"error": {"message": "overloaded", "field": None}}), Reply(200, JEV_REPLY))
    started = time.monotonic()
    reply = await _decide(server)
    assert isinstance(reply.answers["refund"], Answer)
    assert 0.37 <= time.monotonic() - started < 1.5  # one 0.5 s backoff, less jitter


@pytest.mark.parametrize("status", [408, 500, 502, 504])
async def test_other_retryable_statuses(server: JevFakeServer, status: int) -> None:
    server.script(Reply(status, {"error": "x"}, FAST), Reply(200, JEV_REPLY))
    assert isinstance((await _decide(server)).answers["refund"], Answer)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried(server: JevFakeServer, status: int) -> None:
    server.script(Reply(status, {"detail": "no"}, FAST), Reply(200, JEV_REPLY))
    with pytest.raises(EngineHTTPError) as err:
        await _decide(server)
    assert err.value.status == status and not err.value.retryable
    assert len(server.requests) == 1


async def test_max_retries_is_honoured(server: JevFakeServer) -> None:
    server.script(*[Reply(503, {"error": "busy"}, FAST)] * 5)
    with pytest.raises(EngineHTTPError) as err:
        await _decide(server, retries=2)
    assert err.value.status == 503 and err.value.retry_after == 0.005
    assert len(server.requests) == 3


@pytest.mark.xdist_group("timing")  # a wall-clock assertion
async def test_503s_exhaust_the_budget_without_sleeping_past_it(server: JevFakeServer) -> None:
    server.script(*[Reply(503, {"error": "busy"}, {"retry-after-ms": "40"})] * 50)
    engine = JevEngine(Settings(base_url=server.url, profile="jev", timeout_s=0.3, max_retries=100))
    started = time.monotonic()
    with pytest.raises((EngineHTTPError, EngineTimeout)) as err:
        await engine.decide("x", QUESTION)
    elapsed = time.monotonic() - started
    await engine.aclose()
    # Never a pause that would end past the deadline; the last attempt is cut at it (give or take a tick).
    assert elapsed < 0.3 + 0.05
    assert "HTTP 503: busy" in str(err.value)
    assert 3 <= len(server.requests) <= 8


async def test_a_retry_after_beyond_the_budget_fails_at_once(server: JevFakeServer) -> None:
    server.script(Reply(429, {"error": {"message": "rate limited", "field": None}}, {"Retry-After": "30"}))
    started = time.monotonic()
    with pytest.raises(EngineHTTPError) as err:
        await _decide(server, budget=1.0)
    assert time.monotonic() - started < 0.5
    assert err.value.status == 429 and err.value.retry_after == 30.0


async def test_a_slow_server_times_out_within_the_budget(server: JevFakeServer) -> None:
    server.script(Reply(200, JEV_REPLY, delay_s=1.0))
    started = time.monotonic()
    with pytest.raises(EngineTimeout) as err:
        await _decide(server, budget=0.2)
    assert time.monotonic() - started < 0.6
    assert isinstance(err.value.__cause__, Exception)


async def test_read_options_budget_overrides_the_settings(server: JevFakeServer) -> None:
    server.script(Reply(200, JEV_REPLY, delay_s=1.0))
    engine = JevEngine(Settings(base_url=server.url, profile="jev", timeout_s=30.0))
    started = time.monotonic()
    with pytest.raises(EngineTimeout):
        await engine.decide("x", QUESTION, options=ReadOptions(timeout_s=0.15))
    await engine.aclose()
    assert time.monotonic() - started < 0.6


async def test_nothing_listening_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = JevEngine(Settings(base_url=f"http://127.0.0.1:{port}", timeout_s=0.4, max_retries=0))
    with pytest.raises(EngineUnavailable) as err:
        await engine.decide("x", QUESTION)
    await engine.aclose()
    assert err.value.__cause__ is not None
