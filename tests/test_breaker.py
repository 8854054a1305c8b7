"""Circuit breakers: open after repeated failures, fail fast, probe, close; in front of System 1 and System 2."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from langchain_core.messages import HumanMessage

from fastslow.engines.jev import JevEngine, post_with_retries
from fastslow.router import (
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    Noul,
    Question,
    State,
)
from fastslow.router._work import Overloaded
from fastslow.router.engine_api import (
    BreakerChatEngine,
    BreakerEngine,
    BreakerState,
    ChatResult,
    CircuitBreaker,
    CircuitOpen,
    Deadline,
    counts_as_failure,
    may_retry,
)
from fastslow.router.settings import JevSettings

from fakes.jev_server import JevFakeServer, Reply, running_jev_server
from fakes.scripted import ScriptedChat, ScriptedEngine, SyncScriptedEngine

QUESTION = {"refund": Noul(instructions="Does the customer ask for a refund?")}
FAST_500 = Reply(500, {"error": "engine down"}, headers={"retry-after-ms": "1"})


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Flaky:
    """A script that raises ``error`` while ``failing``, else answers yes."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.failing = True

    def __call__(self, state: State, name: str, question: Question) -> Any:
        del state, name, question
        return self.error if self.failing else {"yes": 1.0}


def _breaker(clock: FakeClock, changes: list[tuple[str, str, str]] | None = None, **kw: Any) -> CircuitBreaker:
    def record(name: str, old: BreakerState, new: BreakerState) -> None:
        if changes is not None:
            changes.append((name, old, new))

    kw.setdefault("failures", 3)
    kw.setdefault("open_s", 30.0)
    return CircuitBreaker("jev:test", clock=clock, on_change=record, **kw)


async def _fail(engine: BreakerEngine, times: int) -> None:
    for _ in range(times):
        with pytest.raises(EngineUnavailable):
            await engine.decide("Refund me", QUESTION)


# --- the state machine ---------------------------------------------------------------------------


async def test_opens_after_consecutive_failures_and_then_fails_fast_without_calling_the_engine() -> None:
    clock, changes = FakeClock(), []
    inner = ScriptedEngine(Flaky(EngineUnavailable("connection refused")))
    engine = BreakerEngine(inner, _breaker(clock, changes))
    await _fail(engine, 3)
    assert len(inner.calls) == 3
    assert changes == [("jev:test", "closed", "open")]
    for _ in range(50):
        with pytest.raises(CircuitOpen) as caught:
            await engine.decide("Refund me", QUESTION)
    assert len(inner.calls) == 3  # every one of the 50 was refused here
    assert "circuit open" in str(caught.value) and "next probe in 30.0 s" in str(caught.value)
    assert caught.value.retry_after_s == 30.0
    assert isinstance(caught.value, EngineUnavailable) and caught.value.engine == "jev:test"


async def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    clock = FakeClock()
    script = Flaky(EngineTimeout("no reply"))
    engine = BreakerEngine(ScriptedEngine(script), _breaker(clock))
    for _ in range(3):
        script.failing = True
        with pytest.raises(EngineTimeout):
            await engine.decide("s", QUESTION)
        with pytest.raises(EngineTimeout):
            await engine.decide("s", QUESTION)
        script.failing = False
        await engine.decide("s", QUESTION)
    assert engine.breaker.state == "closed"
    assert engine.breaker.snapshot().consecutive_failures == 0


async def test_after_open_s_one_probe_goes_through_and_its_success_closes_the_breaker() -> None:
    clock, changes = FakeClock(), []
    script = Flaky(EngineHTTPError(503, "busy"))
    inner = ScriptedEngine(script)
    engine = BreakerEngine(inner, _breaker(clock, changes))
    for _ in range(3):
        with pytest.raises(EngineHTTPError):
            await engine.decide("s", QUESTION)
    clock.advance(29.9)
    with pytest.raises(CircuitOpen):
        await engine.decide("s", QUESTION)
    clock.advance(0.1)
    assert engine.breaker.state == "half_open"
    script.failing = False
    reply = await engine.decide("s", QUESTION)
    assert reply.answers["refund"].engine == "scripted"
    assert engine.breaker.state == "closed" and len(inner.calls) == 4
    assert [new for _, _, new in changes] == ["open", "half_open", "closed"]


async def test_a_failed_probe_opens_the_breaker_again_for_another_open_s() -> None:
    clock, changes = FakeClock(), []
    inner = ScriptedEngine(Flaky(EngineProtocolError("not json")))
    engine = BreakerEngine(inner, _breaker(clock, changes, open_s=10.0))
    for _ in range(3):
        with pytest.raises(EngineProtocolError):
            await engine.decide("s", QUESTION)
    clock.advance(10.0)
    with pytest.raises(EngineProtocolError):
        await engine.decide("s", QUESTION)  # the probe
    snap = engine.breaker.snapshot()
    assert snap.state == "open" and snap.opened_at == clock.now and snap.next_probe_at == clock.now + 10.0
    with pytest.raises(CircuitOpen):
        await engine.decide("s", QUESTION)
    assert len(inner.calls) == 4
    assert [new for _, _, new in changes] == ["open", "half_open", "open"]


def test_half_open_lets_only_probes_calls_through_at_once_and_the_first_to_end_decides() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, failures=1, probes=2)
    breaker.settle(breaker.admit(), EngineUnavailable("down"))
    clock.advance(30.0)
    first, second = breaker.admit(), breaker.admit()
    assert first.probe and second.probe
    with pytest.raises(CircuitOpen, match="a probe call is already testing"):
        breaker.admit()
    breaker.settle(first, None)
    assert breaker.state == "closed"
    breaker.settle(second, EngineUnavailable("late"))  # a probe of a state gone by changes nothing
    assert breaker.state == "closed"


def test_a_probe_that_ends_neutrally_hands_its_slot_back() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, failures=1)
    breaker.settle(breaker.admit(), EngineTimeout("slow"))
    clock.advance(30.0)
    breaker.settle(breaker.admit(), asyncio.CancelledError())
    breaker.release(breaker.admit())  # a decide_sync that answered None asked nothing
    assert breaker.state == "half_open"
    breaker.settle(breaker.admit(), None)
    assert breaker.state == "closed"


def test_a_call_admitted_before_the_breaker_opened_cannot_close_it_by_succeeding_late() -> None:
    clock = FakeClock()
    breaker = _breaker(clock, failures=1)
    early = breaker.admit()
    breaker.settle(breaker.admit(), EngineUnavailable("down"))
    breaker.settle(early, None)
    assert breaker.state == "open"


@pytest.mark.parametrize(
    ("error", "counts"),
    [
        (EngineUnavailable("refused"), True),
        (EngineTimeout("slow"), True),
        (EngineProtocolError("garbage"), True),
        (EngineHTTPError(500, "boom"), True),
        (EngineHTTPError(529, "overloaded"), True),
        (EngineHTTPError(429, "rate limited"), True),
        (EngineHTTPError(401, "bad key"), True),
        (EngineHTTPError(403, "forbidden"), True),
        (EngineHTTPError(400, "bad question"), False),
        (EngineHTTPError(422, "too many options"), False),
        (InvalidRequest("questions.refund", "no options"), False),
        (Overloaded("jev:test", queued=64), False),
        (CircuitOpen("open"), False),
        (asyncio.CancelledError(), False),
        (RuntimeError("a bug"), False),
    ],
)
def test_which_errors_count_as_failures(error: BaseException, counts: bool) -> None:
    assert counts_as_failure(error) is counts


async def test_errors_that_are_the_callers_fault_leave_the_breaker_closed() -> None:
    clock = FakeClock()
    for error in (InvalidRequest("state", "empty"), EngineHTTPError(422, "bad"), Overloaded("e", queued=1)):
        inner = ScriptedEngine(Flaky(error))
        engine = BreakerEngine(inner, _breaker(clock, failures=2))
        for _ in range(5):
            with pytest.raises(type(error)):
                await engine.decide("s", QUESTION)
        assert engine.breaker.state == "closed" and len(inner.calls) == 5


async def test_cancelled_calls_do_not_count() -> None:
    clock = FakeClock()
    release = asyncio.Event()

    class Hanging(ScriptedEngine):
        async def decide(self, state: State, questions: Any, **kw: Any) -> Any:
            await release.wait()
            return await super().decide(state, questions, **kw)

    engine = BreakerEngine(Hanging(lambda *_: {"yes": 1.0}), _breaker(clock, failures=1))
    for _ in range(3):
        task = asyncio.create_task(engine.decide("s", QUESTION))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert engine.breaker.state == "closed"


def test_snapshot_while_closed_and_a_reset_by_an_operator() -> None:
    clock, changes = FakeClock(), []
    breaker = _breaker(clock, changes)
    breaker.settle(breaker.admit(), EngineUnavailable("down"))
    snap = breaker.snapshot()
    assert (snap.name, snap.state, snap.consecutive_failures) == ("jev:test", "closed", 1)
    assert snap.opened_at is None and snap.next_probe_at is None and snap.retry_after_s == 0.0
    for _ in range(2):
        breaker.settle(breaker.admit(), EngineUnavailable("down"))
    clock.advance(12.0)
    assert breaker.snapshot().retry_after_s == 18.0
    breaker.reset()
    assert breaker.state == "closed" and breaker.snapshot().consecutive_failures == 0
    assert changes[-1] == ("jev:test", "open", "closed")


def test_threads_sharing_a_breaker_lose_no_count_and_open_it_exactly_once() -> None:
    clock, changes = FakeClock(), []
    breaker = _breaker(clock, changes, failures=400)
    start = threading.Barrier(8)

    def hammer() -> None:
        start.wait()
        for _ in range(100):
            try:
                permit = breaker.admit()
            except CircuitOpen:
                continue
            breaker.settle(permit, EngineUnavailable("down"))

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert changes == [("jev:test", "closed", "open")]
    assert breaker.snapshot().consecutive_failures == 400  # late settles of the old state are ignored


# --- the wrappers ------------------------------------------------------------------------------


def test_decide_sync_goes_through_the_same_breaker_and_is_none_without_a_sync_inner() -> None:
    clock = FakeClock()
    script = Flaky(EngineUnavailable("down"))
    inner = SyncScriptedEngine(script, name="sync")
    engine = BreakerEngine(inner, _breaker(clock, failures=2))
    for _ in range(2):
        with pytest.raises(EngineUnavailable):
            engine.decide_sync("s", QUESTION)
    with pytest.raises(CircuitOpen):
        engine.decide_sync("s", QUESTION)
    assert inner.sync_calls == 2
    clock.advance(30.0)
    script.failing = False
    reply = engine.decide_sync("s", QUESTION)
    assert reply is not None and engine.breaker.state == "closed"
    assert BreakerEngine(ScriptedEngine(script), _breaker(clock)).decide_sync("s", QUESTION) is None


async def test_the_wrapper_shows_the_engines_name_limits_versions_and_attributes() -> None:
    inner = ScriptedEngine(lambda *_: {"yes": 1.0}, name="jev:structured")
    inner.examples_versions = {"refund": "v7"}  # type: ignore[attr-defined]
    engine = BreakerEngine(inner, CircuitBreaker("jev:structured"))
    assert (engine.name, engine.limits, engine.examples_versions) == ("jev:structured", inner.limits, {"refund": "v7"})
    assert engine.calls is inner.calls
    await engine.aclose()


async def test_a_chat_engine_behind_a_breaker_fails_fast_while_open() -> None:
    clock = FakeClock()
    result = ChatResult(content="ok", model="frontier-1")
    inner = ScriptedChat(replies=[EngineHTTPError(529, "overloaded"), EngineTimeout("slow"), result])
    chat = BreakerChatEngine(inner, _breaker(clock, failures=2))
    assert (chat.name, chat.model, chat.base_url) == (inner.name, inner.model, inner.base_url)
    for error in (EngineHTTPError, EngineTimeout):
        with pytest.raises(error):
            await chat.complete([HumanMessage("hi")], timeout_s=1.0)
    with pytest.raises(CircuitOpen):
        await chat.complete([HumanMessage("hi")])
    assert len(inner.calls) == 2
    clock.advance(30.0)
    assert await chat.complete([HumanMessage("hi")]) == result
    assert chat.breaker.state == "closed"
    await chat.aclose()


# --- against a real loopback Jev server ------------------------------------------------------


@pytest.fixture
async def dead() -> AsyncIterator[JevFakeServer]:
    async with running_jev_server("jev") as server:
        yield server


def _jev(server: JevFakeServer, **kw: Any) -> JevEngine:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("max_retries", 2)
    return JevEngine(JevSettings(base_url=server.url, profile="jev", **kw))


async def test_a_hundred_calls_against_a_dead_engine_reach_it_a_handful_of_times_then_it_recovers(
    dead: JevFakeServer,
) -> None:
    clock = FakeClock()
    dead.script(*[FAST_500] * 9)  # then the server answers again
    engine = BreakerEngine(_jev(dead), _breaker(clock, failures=3, open_s=5.0))
    outcomes: list[type[BaseException]] = []
    for _ in range(100):
        try:
            await engine.decide("Refund me", QUESTION)
        except EngineError as exc:
            outcomes.append(type(exc))
    assert outcomes == [EngineHTTPError] * 3 + [CircuitOpen] * 97
    requests = len(dead.requests)
    assert requests == 9  # three calls of three attempts each; none after the breaker opened
    clock.advance(5.0)
    reply = await engine.decide("Refund me", QUESTION)
    assert reply.engine == "jev:jev" and engine.breaker.state == "closed"
    assert len(dead.requests) == requests + 1
    await engine.aclose()


async def test_an_open_breaker_stops_the_wire_clients_retries(dead: JevFakeServer) -> None:
    clock = FakeClock()
    dead.script(Reply(500, {"error": "down"}, headers={"retry-after-ms": "300"}), *[FAST_500] * 5)
    breaker = _breaker(clock, failures=1)
    engine = BreakerEngine(_jev(dead, max_retries=5), breaker)
    try:
        call = asyncio.create_task(engine.decide("Refund me", QUESTION))
        while not dead.requests:
            await asyncio.sleep(0.005)
        breaker.settle(breaker.admit(), EngineUnavailable("another caller saw it down"))
        with pytest.raises(EngineHTTPError) as caught:
            await call  # its pause ended on an open breaker: no retry
        assert caught.value.status == 500 and len(dead.requests) == 1
    finally:
        await engine.aclose()


async def test_post_with_retries_asks_may_retry_before_each_retry(dead: JevFakeServer) -> None:
    dead.script(*[FAST_500] * 4)
    asked: list[int] = []

    def allow() -> bool:
        asked.append(len(dead.requests))
        return len(dead.requests) < 2

    async with httpx2.AsyncClient() as client:
        with pytest.raises(EngineHTTPError):
            await post_with_retries(
                client,
                dead.url + "/v1/systemone",
                content=b"{}",
                headers={"Content-Type": "application/json"},
                deadline=Deadline(2.0),
                max_retries=3,
                engine="jev:jev",
                may_retry=allow,
            )
    assert len(dead.requests) == 2 and asked[0] == 1
    assert may_retry()  # outside any breaker, a retry loop may retry
