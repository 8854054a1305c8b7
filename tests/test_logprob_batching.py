"""Cross-request micro-batches: concurrent logprob reads about different states share a completions request."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from fastslow.engines.logprob import LogprobEngine
from fastslow.router import Answer, Choice, EngineHTTPError, EngineTimeout, Noul, Question, ReadOptions

from fakes.openai_fakes import FakeCompletionServer, openai_error, running_logprob_engine

QUESTIONS: dict[str, Question] = {
    "spam": Noul(instructions="Is it spam?"),
    "route": Choice(criteria={"billing": None, "technical": None, "account": None}, instructions="Which team?"),
}


class HeldServer:
    """``FakeCompletionServer`` whose replies to the requests numbered in ``hold`` wait for ``release(n)``.

    The fake's logprobs are a hash of each prompt, so a caller handed another state's choices would
    get different probabilities. Requests numbered in ``fail`` get a 500 instead.
    """

    def __init__(self, *, hold: set[int] | None = None, fail: set[int] | None = None) -> None:
        self.server = FakeCompletionServer()
        self.held = {n: asyncio.Event() for n in (hold if hold is not None else {0})}
        self.fail = fail or set()
        self.read_timeouts: list[float] = []

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.server.requests

    def release(self, n: int) -> None:
        self.held[n].set()

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        n = len(self.requests)
        reply = self.server(request)  # records the request
        self.read_timeouts.append(float(request.headers["x-stainless-read-timeout"]))
        if n in self.held:
            await self.held[n].wait()
        return openai_error(500, "CUDA out of memory") if n in self.fail else reply


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition`` holds (they only need turns of the loop, not time)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def _queued(engine: LogprobEngine) -> int:
    return engine._batcher.queued


async def _alone(state: str, options: ReadOptions | None = None) -> dict[str, dict[str, float]]:
    """The probabilities a lone call gets about ``state``, from a fresh fake."""
    async with running_logprob_engine() as engine:
        reply = await engine.decide(state, QUESTIONS, options=options)
    return _probabilities(reply.answers)


def _probabilities(answers: Any) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, answer in answers.items():
        assert isinstance(answer, Answer)
        out[name] = dict(answer.probabilities)
    return out


async def _assert_clean(caplog: pytest.LogCaptureFixture) -> None:
    """No task left running, and no future or task dropped with an unread exception or still pending."""
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []


async def test_a_lone_call_is_sent_at_once_in_one_request() -> None:
    server = HeldServer(hold=set())
    async with running_logprob_engine(handler=server) as engine:
        reply = await engine.decide("My invoice is wrong", QUESTIONS)
    assert [len(r["prompt"]) for r in server.requests] == [2]
    assert _probabilities(reply.answers) == await _alone("My invoice is wrong")
    assert reply.usage.output_tokens == 2


async def test_calls_arriving_during_a_request_go_out_together_each_with_its_own_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = HeldServer()
    states = [f"ticket number {i}: {'refund' if i % 2 else 'password'}" for i in range(17)]
    async with running_logprob_engine(handler=server) as engine:
        first = asyncio.create_task(engine.decide(states[0], QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        others = [asyncio.create_task(engine.decide(s, QUESTIONS)) for s in states[1:]]
        await _until(lambda: _queued(engine) == 16 * len(QUESTIONS))
        assert len(server.requests) == 1  # queued behind the held request, not sent
        server.release(0)
        replies = await asyncio.gather(first, *others)

    assert len(server.requests) == 2  # 32 prompts fit one shared request
    assert sum(f"\n{s}\n" in p for s in states[1:] for p in server.requests[1]["prompt"]) == 32
    for state, reply in zip(states, replies, strict=True):
        assert list(reply.answers) == list(QUESTIONS)
        assert _probabilities(reply.answers) == await _alone(state)
    # The shared request's tokens are counted once, by the first of its callers.
    assert [r.usage.output_tokens for r in replies[1:]] == [32] + [0] * 15
    await _assert_clean(caplog)


async def test_a_shared_request_carries_at_most_64_prompts_and_never_splits_a_call() -> None:
    server = HeldServer()
    async with running_logprob_engine(handler=server) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        others = [asyncio.create_task(engine.decide(f"state {i}", QUESTIONS)) for i in range(40)]
        # A group that reaches 64 prompts goes out at once; the rest waits for a request to end.
        await _until(lambda: len(server.requests) == 2 and _queued(engine) == 16)
        server.release(0)
        await asyncio.gather(first, *others)

    assert [len(r["prompt"]) for r in server.requests] == [2, 64, 16]
    for i in range(40):
        assert [sum(f"\nstate {i}\n" in p for p in r["prompt"]) for r in server.requests[1:]] in ([2, 0], [0, 2])


async def test_calls_with_different_seeds_do_not_share_a_request() -> None:
    server = HeldServer()
    async with running_logprob_engine(handler=server) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        seeded = [(f"state {i}", i % 2 + 1) for i in range(4)]
        others = [
            asyncio.create_task(engine.decide(s, {"spam": QUESTIONS["spam"]}, options=ReadOptions(seed=seed)))
            for s, seed in seeded
        ]
        await _until(lambda: _queued(engine) == 4)
        server.release(0)
        replies = await asyncio.gather(first, *others)

    assert "seed" not in server.requests[0]
    by_seed = {r["seed"]: r["prompt"] for r in server.requests[1:]}
    assert len(server.requests) == 3 and sorted(by_seed) == [1, 2]
    for (state, seed), reply in zip(seeded, replies[1:], strict=True):
        assert sum(f"\n{state}\n" in p for p in by_seed[seed]) == 1
        assert _probabilities(reply.answers)["spam"] == (await _alone(state))["spam"]


async def test_an_error_reaches_every_caller_of_the_shared_request_and_the_next_call_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = HeldServer(fail={1})
    async with running_logprob_engine(handler=server, max_retries=0) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        others = [asyncio.create_task(engine.decide(f"state {i}", QUESTIONS)) for i in range(3)]
        await _until(lambda: _queued(engine) == 6)
        server.release(0)
        outcomes = await asyncio.gather(first, *others, return_exceptions=True)
        after = await engine.decide("state 0", QUESTIONS)

    assert not isinstance(outcomes[0], BaseException)
    for outcome in outcomes[1:]:
        assert isinstance(outcome, EngineHTTPError)
        assert (outcome.status, outcome.body, outcome.engine) == (500, "CUDA out of memory", "logprob")
    assert [len(r["prompt"]) for r in server.requests] == [2, 6, 2]
    assert _probabilities(after.answers) == await _alone("state 0")
    await _assert_clean(caplog)


async def test_a_short_budget_leaves_the_queue_and_is_never_sent(caplog: pytest.LogCaptureFixture) -> None:
    server = HeldServer()
    async with running_logprob_engine(handler=server) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        patient = asyncio.create_task(engine.decide("patient", QUESTIONS))
        with pytest.raises(EngineTimeout, match="0.05 s budget"):
            await engine.decide("hasty", QUESTIONS, options=ReadOptions(timeout_s=0.05))
        assert _queued(engine) == 2
        server.release(0)
        replies = await asyncio.gather(first, patient)

    assert [len(r["prompt"]) for r in server.requests] == [2, 2]
    assert all("\npatient\n" in p for p in server.requests[1]["prompt"])
    assert _probabilities(replies[1].answers) == await _alone("patient")
    await _assert_clean(caplog)


async def test_a_short_budget_leaves_a_shared_request_which_carries_on_for_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = HeldServer(hold={0, 1})
    async with running_logprob_engine(handler=server, timeout_s=30.0) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        hasty = asyncio.create_task(engine.decide("hasty", QUESTIONS, options=ReadOptions(timeout_s=0.2)))
        patient = asyncio.create_task(engine.decide("patient", QUESTIONS))
        await _until(lambda: _queued(engine) == 4)
        server.release(0)
        await _until(lambda: len(server.requests) == 2)
        with pytest.raises(EngineTimeout):
            await hasty
        server.release(1)
        replies = await asyncio.gather(first, patient)

    assert len(server.requests[1]["prompt"]) == 4  # both went out together
    assert server.read_timeouts[1] > 1.0  # the shared request has its longest caller's budget
    assert _probabilities(replies[1].answers) == await _alone("patient")
    assert replies[1].usage.output_tokens == 4  # the first caller left; the next one reports the usage
    await _assert_clean(caplog)


async def test_a_shared_request_every_caller_left_is_cancelled_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    server = HeldServer(hold={0, 1})
    async with running_logprob_engine(handler=server) as engine:
        first = asyncio.create_task(engine.decide("first", QUESTIONS))
        await _until(lambda: len(server.requests) == 1)
        callers = [
            asyncio.create_task(engine.decide(f"s{i}", QUESTIONS, options=ReadOptions(timeout_s=0.1))) for i in range(2)
        ]
        await _until(lambda: _queued(engine) == 4)
        server.release(0)
        await first
        outcomes = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(o, EngineTimeout) for o in outcomes)
        await _assert_clean(caplog)  # the held request's task is gone with its callers
        reply = await engine.decide("later", QUESTIONS)

    assert [len(r["prompt"]) for r in server.requests] == [2, 4, 2]
    assert _probabilities(reply.answers) == await _alone("later")
