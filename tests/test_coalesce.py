"""Coalescing: concurrent calls about one state share engine calls; a lone call never waits.

The engine here is a counting fake whose calls block until the test releases them, so every
assertion is about who called the engine with what, ordered by events, never by clocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from fastslow.api.app._admission import GatedEngines
from fastslow.engines import EnginePool
from fastslow.engines.jev import JevEngine
from fastslow.router import (
    Answer,
    Choice,
    ClassifyTask,
    EngineTimeout,
    EngineUnavailable,
    Image,
    Noul,
    PolicySet,
    Question,
    ReadOptions,
    Route,
    Router,
    RouteTask,
    Settings,
    State,
    request_scope,
)
from fastslow.router._answer_cache import AnswerCache
from fastslow.router.engine_api import (
    BreakerEngine,
    CoalescingEngine,
    EngineLimits,
    EngineReply,
    TracedEngine,
    Usage,
)
from fastslow.router.settings import CoalesceSettings, JevSettings, LimitsSettings


def _probs(state: State, name: str, question: Question) -> dict[str, float]:
    # Different for every state and question name, so a mixed-up answer shows.
    first = 0.2 + (len(str(state)) * 7 + len(name) * 3) % 11 / 20
    rest = (1.0 - first) / (len(question.options) - 1)
    return {o: first if i == 0 else rest for i, o in enumerate(question.options)}


class Counting:
    """A DecisionEngine that records its calls and answers once ``release`` is set."""

    name = "counting"
    limits = EngineLimits()
    model = "fake-1"

    def __init__(self, *, held: bool = True, limits: EngineLimits | None = None) -> None:
        self.calls: list[tuple[State, dict[str, Question], ReadOptions | None]] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.cancelled = 0
        self.error: Exception | None = None
        self.examples_versions = {"support": "3-abc"}
        if limits is not None:
            self.limits = limits

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        self.calls.append((state, dict(questions), options))
        self.called.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.error is not None:
            raise self.error
        answers = {
            n: Answer(question=n, kind=q.kind, probabilities=_probs(state, n, q), engine=self.name, model=self.model)
            for n, q in questions.items()
        }
        usage = Usage(input_tokens=10 * len(questions))
        return EngineReply(answers=answers, engine=self.name, model=self.model, latency_ms=1.0, usage=usage)


def _noul(i: int) -> Noul:
    return Noul(instructions=f"is statement {i} true?")


async def _busy(engine: CoalescingEngine, inner: Counting, state: State = "busy") -> asyncio.Task[EngineReply]:
    """A first call, in flight until the test releases it."""
    first = asyncio.create_task(engine.decide(state, {"first": _noul(0)}))
    await inner.called.wait()
    return first


async def test_a_lone_call_goes_to_the_engine_at_once_even_with_a_long_window() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=1.0))
    call = asyncio.create_task(engine.decide("hello", {"q": _noul(1)}))
    async with asyncio.timeout(0.5):  # a failure bound only: a waiting call would sit out the 1 s window
        await inner.called.wait()
    assert len(inner.calls) == 1 and inner.calls[0][1] == {"q": _noul(1)}  # called before anyone else arrived
    inner.release.set()
    reply = await call
    assert set(reply.answers) == {"q"} and reply.usage.input_tokens == 10


async def test_concurrent_callers_about_one_state_share_one_engine_call_and_get_their_own_answers() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="the parcel never came")
    callers = [asyncio.create_task(engine.decide("the parcel never came", {f"q{i}": _noul(i)})) for i in range(20)]
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    inner.release.set()
    replies = await asyncio.gather(first, *callers)
    assert len(inner.calls) == 2  # the first alone, the 20 others together
    assert set(inner.calls[1][1]) == {f"q{i}" for i in range(20)}
    for i, reply in enumerate(replies[1:]):
        assert set(reply.answers) == {f"q{i}"}
        answer = reply.answers[f"q{i}"]
        assert isinstance(answer, Answer)
        assert answer.probabilities == _probs("the parcel never came", f"q{i}", _noul(i))
    assert sum(r.usage.input_tokens for r in replies[1:]) == 200  # counted once, by the caller that opened the call
    shared = engine._shared
    assert (shared.running, shared.pending, shared.identical, shared.unkeyed) == (0, {}, {}, set())  # nothing kept


async def test_different_states_and_clashing_names_are_not_merged() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner)
    a = asyncio.create_task(engine.decide("state a", {"q": _noul(1)}))
    b = asyncio.create_task(engine.decide("state b", {"q": _noul(1)}))
    clash = asyncio.create_task(engine.decide("state a", {"q": _noul(2)}))  # same name, another question
    while len(inner.calls) < 4:
        await asyncio.sleep(0)
    inner.release.set()
    replies = await asyncio.gather(first, a, b, clash)
    sent = sorted((c[0], str(c[1]["q"].instructions)) for c in inner.calls[1:])
    assert sent == [
        ("state a", "is statement 1 true?"),
        ("state a", "is statement 2 true?"),
        ("state b", "is statement 1 true?"),
    ]
    assert replies[3].answers["q"].probabilities == _probs("state a", "q", _noul(2))  # type: ignore[union-attr]


async def test_a_batch_respects_the_engine_question_limit() -> None:
    inner = Counting(limits=EngineLimits(max_questions=4))
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="s")
    callers = [asyncio.create_task(engine.decide("s", {f"q{i}": _noul(i)})) for i in range(10)]
    while len(inner.calls) < 4:
        await asyncio.sleep(0)
    inner.release.set()
    await asyncio.gather(first, *callers)
    assert [len(c[1]) for c in inner.calls] == [1, 4, 4, 2]


async def test_identical_requests_in_flight_share_one_result() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner)
    question = {"route": Choice(criteria={"billing": None, "shipping": None})}
    first = asyncio.create_task(engine.decide("where is my parcel", question))
    await inner.called.wait()
    same = [asyncio.create_task(engine.decide("where is my parcel", question)) for _ in range(5)]
    await asyncio.sleep(0)
    inner.release.set()
    replies = await asyncio.gather(first, *same)
    assert len(inner.calls) == 1
    assert all(r.answers == replies[0].answers for r in replies)
    assert [r.usage.input_tokens for r in replies] == [10, 0, 0, 0, 0, 0]


async def test_one_caller_timing_out_does_not_cancel_or_fail_the_others() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="s")
    impatient = asyncio.create_task(engine.decide("s", {"a": _noul(1)}, options=ReadOptions(timeout_s=0.01)))
    patient = asyncio.create_task(engine.decide("s", {"b": _noul(2)}))
    with pytest.raises(EngineTimeout):
        await impatient
    assert not patient.done()
    inner.release.set()
    reply = await patient
    assert set(reply.answers) == {"b"} and inner.cancelled == 0
    await first
    shared = inner.calls[1]
    assert set(shared[1]) == {"a", "b"} and shared[2] is not None and shared[2].timeout_s is None  # the longest budget


async def test_the_shared_call_runs_to_the_longest_deadline_not_the_openers() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="s")
    with request_scope(timeout_s=0.5):
        short = asyncio.create_task(engine.decide("s", {"a": _noul(1)}))
    with request_scope(timeout_s=30.0):
        long = asyncio.create_task(engine.decide("s", {"b": _noul(2)}))
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    options = inner.calls[1][2]
    assert options is not None and options.timeout_s is not None and options.timeout_s > 1.0
    inner.release.set()
    await asyncio.gather(first, short, long)


async def test_a_shared_call_is_cancelled_only_once_every_caller_has_left() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="s")
    one = asyncio.create_task(engine.decide("s", {"a": _noul(1)}))
    two = asyncio.create_task(engine.decide("s", {"b": _noul(2)}))
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    one.cancel()
    await asyncio.sleep(0)
    assert inner.cancelled == 0  # the second caller still waits for it
    two.cancel()
    while inner.cancelled == 0:
        await asyncio.sleep(0)
    assert len(inner.calls) == 2 and inner.cancelled == 1
    inner.release.set()
    await first  # the first call, its caller still there, was never touched


async def test_a_caller_sharing_a_call_whose_only_other_caller_left_asks_again() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner)
    question = {"q": _noul(1)}
    one = asyncio.create_task(engine.decide("s", question))
    await inner.called.wait()
    two = asyncio.create_task(engine.decide("s", question))
    await asyncio.sleep(0)
    one.cancel()  # the call ran in its caller's own task, so it ends with it
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    inner.release.set()
    reply = await two
    assert set(reply.answers) == {"q"} and inner.cancelled == 1 and one.cancelled()


async def test_an_engine_error_reaches_every_caller_of_the_call() -> None:
    inner = Counting()
    inner.error = EngineUnavailable("down", engine="counting")
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    first = await _busy(engine, inner, state="s")
    callers = [asyncio.create_task(engine.decide("s", {f"q{i}": _noul(i)})) for i in range(3)]
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    inner.release.set()
    results = await asyncio.gather(first, *callers, return_exceptions=True)
    assert len(inner.calls) == 2
    assert all(isinstance(r, EngineUnavailable) for r in results)


async def test_the_answer_cache_is_off_by_default() -> None:
    assert Settings().coalesce.cache_ttl_s == 0
    inner = Counting(held=False)
    engine = CoalescingEngine(inner)
    for _ in range(2):
        await engine.decide("s", {"q": _noul(1)})
    assert len(inner.calls) == 2


async def test_the_answer_cache_is_keyed_by_policy_version_state_and_question() -> None:
    inner = Counting(held=False)
    engine = CoalescingEngine(inner, CoalesceSettings(cache_ttl_s=60.0, cache_entries=100))
    v1, v2 = engine.for_policy("v1"), engine.for_policy("v2")
    assert engine.for_policy("v1") is v1
    first = await v1.decide("s", {"q": _noul(1)})
    again = await v1.decide("s", {"renamed": _noul(1)})  # the same question under another name
    assert len(inner.calls) == 1
    assert again.answers["renamed"].question == "renamed"
    assert again.answers["renamed"].probabilities == first.answers["q"].probabilities  # type: ignore[union-attr]
    await v1.decide("s", {"q": _noul(1), "other": _noul(2)})  # only the new question is asked
    assert list(inner.calls[-1][1]) == ["other"]
    await v1.decide("t", {"q": _noul(1)})
    await v2.decide("s", {"q": _noul(1)})
    await v1.decide("s", {"q": _noul(1)}, options=ReadOptions(violations={"q": "yes"}))
    assert len(inner.calls) == 5  # another state, another policy version, another read


def test_the_answer_cache_is_bounded_least_recently_used_first() -> None:
    cache = AnswerCache(ttl_s=60.0, entries=2)
    answers = {
        k: Answer(question=k, kind="noul", probabilities={"yes": 1.0, "no": 0.0}, engine="e", model="m") for k in "abc"
    }
    cache.put("a", answers["a"])
    cache.put("b", answers["b"])
    assert cache.get("a") is answers["a"]  # a is now the most recent
    cache.put("c", answers["c"])
    assert len(cache) == 2 and cache.get("b") is None and cache.get("a") is answers["a"]


def test_cached_answers_expire_after_their_ttl() -> None:
    now = [1000.0]
    cache = AnswerCache(ttl_s=5.0, entries=10, clock=lambda: now[0])
    answer = Answer(question="a", kind="noul", probabilities={"yes": 1.0, "no": 0.0}, engine="e", model="m")
    cache.put("a", answer)
    now[0] += 4.9
    assert cache.get("a") is answer
    now[0] += 0.2  # 5.1 s after it was put: a read does not extend its life
    assert cache.get("a") is None and len(cache) == 0
    cache.put("a", answer)  # put again, it lives another ttl from now
    now[0] += 4.9
    assert cache.get("a") is answer


def _policy(version: str) -> PolicySet:
    routes = {"billing": Route(name="billing"), "technical": Route(name="technical")}
    return PolicySet(tasks={"support": RouteTask(name="support", routes=routes)}, version=version)


async def test_the_pool_wraps_each_engine_once_and_shows_its_attributes() -> None:
    settings = Settings(engine="jev", jev=JevSettings(base_url="http://127.0.0.1:9"))
    pool = EnginePool(settings)
    engine = pool.engine_for(None, _policy("v1"))
    # A network engine sits behind its breaker, inside coalescing, with a span per call made innermost.
    assert isinstance(engine, CoalescingEngine) and isinstance(engine.inner, BreakerEngine)
    assert isinstance(engine.inner.inner, TracedEngine) and isinstance(engine.inner.inner.inner, JevEngine)
    assert pool.engine_for("jev", _policy("v2")) is engine
    assert engine.url == engine.inner.inner.inner.url  # read through every wrapper, for the readiness probe
    await pool.aclose()
    off = EnginePool(settings.model_copy(update={"coalesce": CoalesceSettings(enabled=False)}))
    assert isinstance(off.engine_for(None, _policy("v1")), BreakerEngine)
    await off.aclose()


class _Source:
    def __init__(self, engine: CoalescingEngine) -> None:
        self.engine = engine

    def engine_for(self, name: object, policy: PolicySet) -> CoalescingEngine:
        return self.engine


async def test_callers_joining_a_shared_call_take_no_place_at_the_admission_gate(tmp_path: Path) -> None:
    inner = Counting()
    gated = GatedEngines(
        _Source(CoalescingEngine(inner, CoalesceSettings(window_s=0.0))),  # type: ignore[arg-type]
        LimitsSettings(remote_engine_concurrency=2, engine_queue=0),
        default="jev",
    )
    engine = gated.engine_for(None, _policy("v1"))
    assert engine.examples_versions == {"support": "3-abc"}  # the router reads it off the engine
    first = asyncio.create_task(engine.decide("s", {"first": _noul(0)}))
    await inner.called.wait()
    # Six callers with two places and no queue: alone, four of them would be refused (Overloaded).
    callers = [
        asyncio.create_task(gated.engine_for(None, _policy("v1")).decide("s", {f"q{i}": _noul(i)})) for i in range(6)
    ]
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    assert gated.gate(None).active == 2
    inner.release.set()
    replies = await asyncio.gather(first, *callers)
    assert [set(r.answers) for r in replies[1:]] == [{f"q{i}"} for i in range(6)]
    assert gated.gate(None).active == 0


class _NoChats:
    def chat_for(self, ref: str | None) -> None:
        del ref


async def test_concurrent_router_calls_about_one_state_each_get_their_own_decision() -> None:
    inner = Counting()
    engine = CoalescingEngine(inner, CoalesceSettings(window_s=0.0))
    tasks = {f"fact{i}": ClassifyTask(name=f"fact{i}", questions={"q": _noul(i)}) for i in range(16)}
    policy = PolicySet(tasks=tasks, version="v1")  # type: ignore[arg-type]
    router = Router(lambda: policy, _Source(engine), _NoChats())  # type: ignore[arg-type]
    calls = [asyncio.create_task(router.classify(f"fact{i}", "one ticket")) for i in range(16)]
    while len(inner.calls) < 2:
        await asyncio.sleep(0)
    inner.release.set()
    decisions = await asyncio.gather(*calls)
    assert len(inner.calls) == 2 and set(inner.calls[1][1]) == {f"fact{i}.q" for i in range(1, 16)}
    for i, by_question in enumerate(decisions):
        decision = by_question["q"]
        expected = _probs("one ticket", f"fact{i}.q", _noul(i))
        assert decision.task == f"fact{i}" and decision.confidence == pytest.approx(max(expected.values()))
