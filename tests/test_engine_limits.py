"""Network engines stop at their deadline and refuse oversized replies, against a misbehaving loopback server.

Each engine runs as the registry builds it (its own HTTP client; the SDK engines through the real
``openai`` SDK) against ``fakes.slow_server``: a reply trickled a byte at a time must end in
``EngineTimeout`` at the call's budget, however long the server would go on; a 30 MB reply (declared,
chunked or gzip-inflated) must be refused quickly, without being held in memory, and not retried.
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import SecretStr

from fastslow.engines import build_engine
from fastslow.engines.jev import JevEngine
from fastslow.engines.logprob import LogprobEngine
from fastslow.engines.openai_decisions import OpenAIDecisionsEngine
from fastslow.router import Answer, EngineProtocolError, EngineTimeout, Noul, Settings
from fastslow.router.engine_api import DecisionEngine
from fastslow.router.settings import JevSettings, LimitsSettings, LogprobSettings, OpenAIDecisionsSettings

from fakes.jev_replies import JEV_REPLY
from fakes.openai_fakes import FakeCompletionServer, FakeDecisionsServer
from fakes.slow_server import OVERSIZED_BYTES, Mode, Respond, SlowServer, from_handler, running_slow_server

KINDS = ["jev", "openai-decisions", "logprob", "logprob-chat"]
QUESTION = {"refund": Noul(instructions="Does the customer ask for a refund?")}
CAP = LimitsSettings().max_engine_reply_bytes
MIB = 1024 * 1024


def _jev_reply(path: str, body: bytes) -> tuple[int, bytes]:
    return 200, json.dumps(JEV_REPLY).encode()


def _respond(kind: str) -> Respond:
    if kind == "jev":
        return _jev_reply
    if kind == "openai-decisions":
        return from_handler(FakeDecisionsServer())
    return from_handler(FakeCompletionServer())


def _engine(kind: str, url: str, *, timeout_s: float, max_retries: int = 2, **kw: Any) -> DecisionEngine:
    if kind == "jev":
        jev = JevSettings(base_url=url, profile="jev", timeout_s=timeout_s, max_retries=max_retries)
        return JevEngine(jev, **kw)
    if kind == "openai-decisions":
        decisions = OpenAIDecisionsSettings(
            api_key=SecretStr("sk-test"), base_url=f"{url}/v1", timeout_s=timeout_s, max_retries=max_retries
        )
        return OpenAIDecisionsEngine(decisions, **kw)
    logprob = LogprobSettings(base_url=f"{url}/v1", model="fake-lm", timeout_s=timeout_s, max_retries=max_retries)
    return LogprobEngine(logprob, chat=kind == "logprob-chat", **kw)


@contextmanager
def _serving(kind: str, mode: Mode, **kw: Any) -> Iterator[SlowServer]:
    with running_slow_server(_respond(kind), mode=mode, **kw) as server:
        yield server


@contextmanager
def _peak_memory() -> Iterator[list[int]]:
    """Yields a list that holds, on exit, the peak of Python allocations inside the block."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


# --- a normal reply ------------------------------------------------------------------------------


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_normal_reply_is_answered(kind: str, gzip: bool) -> None:
    with _serving(kind, "normal", gzip=gzip) as server:
        engine = _engine(kind, server.url, timeout_s=5.0)
        try:
            reply = await engine.decide("I was charged twice, refund me", QUESTION)
        finally:
            await engine.aclose()
    assert isinstance(reply.answers["refund"], Answer)
    assert len(server.requests) == 1


# --- deadlines -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.xdist_group("timing")  # a wall-clock assertion
async def test_a_trickling_reply_times_out_at_the_deadline_and_its_connection_is_dropped(kind: str) -> None:
    with _serving(kind, "trickle") as server:
        engine = _engine(kind, server.url, timeout_s=1.0)
        try:
            started = time.monotonic()
            with pytest.raises(EngineTimeout) as err:
                await engine.decide("Refund me", QUESTION)
            elapsed = time.monotonic() - started
            # The client closed the half-read connection rather than pooling it.
            assert server.hung_up.wait(5.0)
            trickled_on = {r.client_port for r in server.requests}

            server.mode = "normal"
            reply = await engine.decide("Refund me", QUESTION)
        finally:
            await engine.aclose()
    assert elapsed < 1.0 + 1.0, elapsed
    assert "1 s budget" in str(err.value)
    assert isinstance(reply.answers["refund"], Answer)
    assert server.requests[-1].client_port not in trickled_on


async def test_one_failed_read_of_several_stops_the_others_at_once() -> None:
    # The chat logprob engine sends one request per question: one floods, the other trickles.
    with _serving("logprob-chat", "normal") as server:
        server.script("oversized-chunked", "trickle")
        engine = _engine("logprob-chat", server.url, timeout_s=30.0, max_retries=0)
        questions = {**QUESTION, "angry": Noul(instructions="Is the customer angry?")}
        try:
            with pytest.raises(EngineProtocolError):
                await engine.decide("Refund me", questions)
            # Before aclose, which would drop the connection anyway: the trickled read was cancelled.
            given_up = time.monotonic() + 3.0
            while "trickle" not in server.hung_up_modes and time.monotonic() < given_up:
                await asyncio.sleep(0.05)
        finally:
            await engine.aclose()
    assert "trickle" in server.hung_up_modes


# --- reply size ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["oversized", "oversized-chunked", "oversized-gzip"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.xdist_group("timing")  # a wall-clock assertion
async def test_an_oversized_reply_is_refused_quickly_without_being_held_or_retried(kind: str, mode: Mode) -> None:
    with _serving(kind, mode) as server:
        engine = _engine(kind, server.url, timeout_s=30.0, max_retries=2)
        try:
            with _peak_memory() as peak:
                started = time.monotonic()
                with pytest.raises(EngineProtocolError) as err:
                    await engine.decide("Refund me", QUESTION)
                elapsed = time.monotonic() - started
        finally:
            await engine.aclose()
    message = str(err.value)
    assert f"{CAP}-byte limit" in message and "limits.max_engine_reply_bytes" in message
    assert err.value.engine == engine.name
    if mode == "oversized":
        assert f"declares a {OVERSIZED_BYTES}-byte body" in message
        assert server.hung_up.wait(5.0)  # refused on its headers: most of the body was never read
    assert elapsed < 5.0, elapsed
    # Reading all 30 MB would hold at least that much; the cap stops reading at 8 MiB.
    assert peak[0] < CAP + 8 * MIB, peak[0]
    assert len(server.requests) == 1  # a reply too large is not retried


@pytest.mark.parametrize("kind", ["jev", "openai-decisions", "logprob"])
async def test_the_registry_wires_the_limit_from_the_settings(kind: str) -> None:
    padding = "x" * 8192

    def padded(path: str, body: bytes) -> tuple[int, bytes]:
        status, reply = _respond(kind)(path, body)
        return status, json.dumps({**json.loads(reply), "id": padding}).encode()

    with running_slow_server(padded) as server:
        settings = Settings(
            engine=kind,  # type: ignore[arg-type]
            jev=JevSettings(base_url=server.url, profile="jev", max_retries=0),
            openai_decisions=OpenAIDecisionsSettings(api_key=SecretStr("sk-test"), base_url=f"{server.url}/v1"),
            logprob=LogprobSettings(base_url=f"{server.url}/v1", model="fake-lm"),
        )
        roomy = build_engine(settings)
        tight = build_engine(settings.model_copy(update={"limits": LimitsSettings(max_engine_reply_bytes=4096)}))
        try:
            assert isinstance((await roomy.decide("Refund me", QUESTION)).answers["refund"], Answer)
            with pytest.raises(EngineProtocolError, match="4096-byte limit"):
                await tight.decide("Refund me", QUESTION)
        finally:
            await roomy.aclose()
            await tight.aclose()
