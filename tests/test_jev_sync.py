"""``JevEngine.decide_sync``: the async client's request, retries, deadline and reply cap, over a sync client.

Against the loopback fakes the async tests use (``fakes.jev_server`` for computed replies and
scripted statuses, ``fakes.slow_server`` for trickled, flooded and gzip-bombed bodies).
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from fastslow.engines.jev import JevEngine
from fastslow.router import (
    Answer,
    Choice,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    Image,
    Noul,
    ReadOptions,
)
from fastslow.router.settings import JevSettings, LimitsSettings

from fakes.jev_replies import JEV_REPLY
from fakes.jev_server import JevFakeServer, Reply
from fakes.slow_server import OVERSIZED_BYTES, Mode, running_slow_server

QUESTION = {"refund": Noul(instructions="Does the customer ask for a refund?")}
FAST = {"retry-after-ms": "5"}
CAP = LimitsSettings().max_engine_reply_bytes


@pytest.fixture
def server() -> Iterator[JevFakeServer]:
    fake = JevFakeServer("structured")
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def scripted() -> Iterator[JevFakeServer]:
    fake = JevFakeServer(None)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def _engine(url: str, *, profile: Any = "jev", budget: float = 2.0, retries: int = 2, **kw: Any) -> JevEngine:
    return JevEngine(JevSettings(base_url=url, profile=profile, timeout_s=budget, max_retries=retries), **kw)


def _close(engine: JevEngine) -> None:
    asyncio.run(engine.aclose())


def test_the_sync_request_and_reply_are_the_async_ones(server: JevFakeServer) -> None:
    engine = _engine(server.url, profile="structured")
    questions = {**QUESTION, "route": Choice(criteria={"billing": "money", "tech": "bugs", "other": None})}

    async def awaited_then_closed() -> Any:
        try:
            return await engine.decide("I was charged twice, refund me", questions)
        finally:
            await engine.aclose()

    synced = engine.decide_sync("I was charged twice, refund me", questions)
    awaited = asyncio.run(awaited_then_closed())
    assert synced is not None
    second, first = server.requests
    assert first.json == second.json
    assert {k: v for k, v in first.headers.items() if k not in ("content-length",)} == {
        k: v for k, v in second.headers.items() if k not in ("content-length",)
    }
    assert list(synced.answers) == list(awaited.answers) == ["refund", "route"]
    for name, answer in synced.answers.items():
        other = awaited.answers[name]
        assert isinstance(answer, Answer) and isinstance(other, Answer)
        assert answer.probabilities == other.probabilities and answer.signals == other.signals
    assert (synced.model, synced.usage) == (awaited.model, awaited.usage)


def test_a_sync_client_keeps_its_connection_between_calls(server: JevFakeServer) -> None:
    engine = _engine(server.url, profile="structured")
    try:
        for _ in range(3):
            assert engine.decide_sync("x", QUESTION) is not None
    finally:
        _close(engine)
    assert len({r.client_port for r in server.requests}) == 1


def test_retryable_statuses_are_retried_then_answered(scripted: JevFakeServer) -> None:
    scripted.script(
        Reply(503, {"error": {"message": "busy"}}, headers=FAST), Reply(429, {}, headers=FAST), Reply(200, JEV_REPLY)
    )
    engine = _engine(scripted.url)
    try:
        reply = engine.decide_sync("Refund me", QUESTION)
    finally:
        _close(engine)
    assert reply is not None and isinstance(reply.answers["refund"], Answer)
    assert len(scripted.requests) == 3


def test_a_client_error_is_raised_at_once_with_its_message(scripted: JevFakeServer) -> None:
    scripted.script(Reply(422, {"error": {"message": "bad question", "field": "questions.refund"}}))
    engine = _engine(scripted.url)
    try:
        with pytest.raises(EngineHTTPError) as err:
            engine.decide_sync("Refund me", QUESTION)
    finally:
        _close(engine)
    assert err.value.status == 422 and "bad question" in str(err.value)
    assert len(scripted.requests) == 1


def test_a_retry_after_beyond_the_budget_fails_at_once(scripted: JevFakeServer) -> None:
    scripted.script(Reply(429, {}, headers={"retry-after": "30"}))
    engine = _engine(scripted.url, budget=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(EngineHTTPError) as err:
            engine.decide_sync("Refund me", QUESTION)
    finally:
        _close(engine)
    assert time.monotonic() - started < 0.5
    assert err.value.retry_after == 30.0


def test_a_slow_server_times_out_within_the_options_budget(scripted: JevFakeServer) -> None:
    scripted.script(Reply(200, JEV_REPLY, delay_s=1.0))
    engine = _engine(scripted.url, budget=30.0)
    started = time.monotonic()
    try:
        with pytest.raises(EngineTimeout):
            engine.decide_sync("x", QUESTION, options=ReadOptions(timeout_s=0.2))
    finally:
        _close(engine)
    assert time.monotonic() - started < 0.7


def test_nothing_listening_is_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = _engine(f"http://127.0.0.1:{port}", budget=0.4, retries=0)
    try:
        with pytest.raises(EngineUnavailable):
            engine.decide_sync("x", QUESTION)
    finally:
        _close(engine)


def _jev_reply(path: str, body: bytes) -> tuple[int, bytes]:
    import json

    return 200, json.dumps(JEV_REPLY).encode()


@pytest.mark.xdist_group("timing")  # a wall-clock assertion
def test_a_trickling_reply_is_cut_off_within_one_read_of_the_deadline() -> None:
    with running_slow_server(_jev_reply, mode="trickle") as slow:
        engine = _engine(slow.url, budget=1.0)
        try:
            started = time.monotonic()
            with pytest.raises(EngineTimeout) as err:
                engine.decide_sync("Refund me", QUESTION)
            elapsed = time.monotonic() - started
            # The half-read connection was closed, not pooled: the next call gets a new one.
            assert slow.hung_up.wait(5.0)
            trickled_on = {r.client_port for r in slow.requests}
            slow.mode = "normal"
            reply = engine.decide_sync("Refund me", QUESTION)
        finally:
            _close(engine)
    # Each trickled byte comes within 0.3 s, so the cut comes at most one byte after the deadline.
    assert elapsed < 1.0 + 0.5, elapsed
    assert "1 s budget" in str(err.value)
    assert reply is not None and isinstance(reply.answers["refund"], Answer)
    assert slow.requests[-1].client_port not in trickled_on


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_a_normal_reply_is_answered_plain_or_gzipped(gzip: bool) -> None:
    with running_slow_server(_jev_reply, mode="normal", gzip=gzip) as slow:
        engine = _engine(slow.url, budget=5.0)
        try:
            reply = engine.decide_sync("Refund me", QUESTION)
        finally:
            _close(engine)
    assert reply is not None and isinstance(reply.answers["refund"], Answer)


@pytest.mark.parametrize("mode", ["oversized", "oversized-chunked", "oversized-gzip"])
def test_an_oversized_reply_is_refused_without_being_held_or_retried(mode: Mode) -> None:
    with running_slow_server(_jev_reply, mode=mode) as slow:
        engine = _engine(slow.url, budget=30.0)
        tracemalloc.start()
        try:
            with pytest.raises(EngineProtocolError) as err:
                engine.decide_sync("Refund me", QUESTION)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            _close(engine)
    assert f"{CAP}-byte limit" in str(err.value)
    if mode == "oversized":
        assert f"declares a {OVERSIZED_BYTES}-byte body" in str(err.value)
    assert peak < CAP + 8 * 1024 * 1024, peak
    assert len(slow.requests) == 1


def test_what_needs_the_event_loop_is_left_to_decide(server: JevFakeServer) -> None:
    engine = _engine(server.url, profile="structured")
    many = Choice(criteria={f"option {i}": None for i in range(60)})
    try:
        # Too many options for one structured read: split_and_ask sends several requests.
        assert engine.decide_sync("x", {"route": many}) is None
        image = Image(data=b"\x89PNG\r\n\x1a\n" + b"0" * 32, format="png")
        assert engine.decide_sync("x", QUESTION, images=[image]) is None
    finally:
        _close(engine)
    assert server.requests == []
    given_async = _engine(server.url, profile="structured", http_client=httpx2.AsyncClient())
    # Its own transport, proxies or certificates may matter: no sync client is made beside it.
    assert given_async.decide_sync("x", QUESTION) is None
    with httpx2.Client() as client:
        given_both = _engine(
            server.url, profile="structured", http_client=httpx2.AsyncClient(), sync_http_client=client
        )
        assert given_both.decide_sync("x", QUESTION) is not None
