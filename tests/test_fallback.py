"""Fallback chains: the next engine on a failure that counts or an open breaker, all within one deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from fastslow.engines.jev import JevEngine
from fastslow.router import (
    EngineHTTPError,
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    Noul,
    Question,
    ReadOptions,
    State,
    ToolCall,
)
from fastslow.router._work import Overloaded, request_scope
from fastslow.router.engine_api import (
    BreakerEngine,
    ChatResult,
    CircuitBreaker,
    CircuitOpen,
    EngineLimits,
    EngineReply,
    FallbackChatEngine,
    FallbackEngine,
    ToolOutcome,
)
from fastslow.router.settings import JevSettings

from fakes.jev_server import Reply, running_jev_server
from fakes.scripted import ScriptedChat, ScriptedEngine, SyncScriptedEngine

QUESTION = {"refund": Noul(instructions="Does the customer ask for a refund?")}


def _yes(state: State, name: str, question: Question) -> Mapping[str, float]:
    del state, name, question
    return {"yes": 1.0}


def _raising(error: Exception) -> Any:
    def script(state: State, name: str, question: Question) -> Exception:
        del state, name, question
        return error

    return script


class Recording(ScriptedEngine):
    """A scripted engine that also records the budget each call was given, and can take its time."""

    def __init__(self, script: Any, name: str, delay_s: float = 0.0) -> None:
        super().__init__(script, name=name)
        self.delay_s = delay_s
        self.budgets: list[float | None] = []

    async def decide(self, state: State, questions: Any, *, options: ReadOptions | None = None, **kw: Any) -> Any:
        self.budgets.append(options.timeout_s if options is not None else None)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().decide(state, questions, options=options, **kw)


def _open_breaker(name: str) -> CircuitBreaker:
    breaker = CircuitBreaker(name, failures=1, open_s=60.0)
    breaker.settle(breaker.admit(), EngineUnavailable("down"))
    return breaker


@pytest.mark.parametrize(
    "error",
    [EngineUnavailable("refused"), EngineTimeout("slow"), EngineHTTPError(401, "bad key"), Overloaded("a", queued=9)],
)
async def test_falls_to_the_second_engine_when_the_first_cannot_serve(error: Exception) -> None:
    first, second = ScriptedEngine(_raising(error), name="a"), ScriptedEngine(_yes, name="b")
    chain = FallbackEngine(first, second)
    reply = await chain.decide("Refund me", QUESTION)
    assert reply.engine == "b" and reply.answers["refund"].engine == "b"
    assert len(first.calls) == 1 and len(second.calls) == 1
    assert chain.name == "fallback:a,b"


async def test_the_first_engine_that_answers_is_the_only_one_asked() -> None:
    first, second = ScriptedEngine(_yes, name="a"), ScriptedEngine(_yes, name="b")
    reply = await FallbackEngine(first, second).decide("Refund me", QUESTION)
    assert reply.engine == "a" and not second.calls


async def test_an_engine_behind_an_open_breaker_is_skipped_without_being_called_or_waited_for() -> None:
    first = ScriptedEngine(_yes, name="a")
    chain = FallbackEngine(BreakerEngine(first, _open_breaker("a")), ScriptedEngine(_yes, name="b"))
    started = time.monotonic()
    reply = await chain.decide("Refund me", QUESTION, options=ReadOptions(timeout_s=5.0))
    assert reply.engine == "b" and not first.calls
    assert time.monotonic() - started < 5.0  # it never waited for the open engine's budget


@pytest.mark.parametrize("error", [InvalidRequest("questions.refund", "no options"), EngineHTTPError(422, "bad")])
async def test_the_callers_fault_is_raised_at_once_without_asking_the_next_engine(error: Exception) -> None:
    second = ScriptedEngine(_yes, name="b")
    with pytest.raises(type(error)):
        await FallbackEngine(ScriptedEngine(_raising(error), name="a"), second).decide("s", QUESTION)
    assert not second.calls


async def test_when_all_fail_the_last_meaningful_error_is_raised_and_the_others_noted() -> None:
    chain = FallbackEngine(
        ScriptedEngine(_raising(EngineHTTPError(401, "bad key")), name="a"),
        ScriptedEngine(_raising(EngineTimeout("slow")), name="b"),
        BreakerEngine(ScriptedEngine(_yes, name="c"), _open_breaker("c")),
    )
    with pytest.raises(EngineTimeout) as caught:
        await chain.decide("s", QUESTION)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "a: EngineHTTPError: HTTP 401: bad key" in notes and "c: CircuitOpen" in notes
    assert "bad key" not in str(caught.value)  # the summary is for the log, not the client's message


async def test_when_every_breaker_is_open_the_circuit_open_error_is_raised() -> None:
    chain = FallbackEngine(
        BreakerEngine(ScriptedEngine(_yes, name="a"), _open_breaker("a")),
        BreakerEngine(ScriptedEngine(_yes, name="b"), _open_breaker("b")),
    )
    with pytest.raises(CircuitOpen, match="circuit open"):
        await chain.decide("s", QUESTION)


async def test_every_engine_gets_what_is_left_of_one_budget_and_none_is_asked_once_it_is_spent() -> None:
    first = Recording(_raising(EngineTimeout("slow")), "a", delay_s=0.05)
    second = Recording(_raising(EngineUnavailable("down")), "b", delay_s=0.06)
    third = Recording(_yes, "c")
    chain = FallbackEngine(first, second, third)
    with pytest.raises(EngineUnavailable) as caught:
        await chain.decide("s", QUESTION, options=ReadOptions(timeout_s=0.1))
    [given] = first.budgets
    [left] = second.budgets
    assert given is not None and 0.09 < given <= 0.1
    assert left is not None and left <= 0.1 - 0.05
    assert not third.budgets  # the budget was spent before its turn
    assert "c: not asked, the budget ran out" in " ".join(caught.value.__notes__)


async def test_the_request_deadline_bounds_the_chain_when_the_call_sets_no_budget() -> None:
    first, second = Recording(_raising(EngineUnavailable("down")), "a"), Recording(_yes, "b")
    with request_scope(timeout_s=0.5):
        await FallbackEngine(first, second).decide("s", QUESTION)
    [budget] = second.budgets
    assert budget is not None and budget <= 0.5
    assert (await FallbackEngine(first, second).decide("s", QUESTION)).engine == "b"
    assert first.budgets[-1] is None  # no budget anywhere: each engine keeps its own default


async def test_a_spent_budget_raises_a_timeout_without_asking_anyone() -> None:
    first = Recording(_yes, "a")
    with request_scope(timeout_s=0.0), pytest.raises(EngineTimeout, match="before any engine was asked"):
        await FallbackEngine(first).decide("s", QUESTION)
    assert not first.budgets


def test_decide_sync_falls_back_and_is_none_when_an_engine_needs_the_loop() -> None:
    first = SyncScriptedEngine(_raising(EngineUnavailable("down")), name="a")
    second = SyncScriptedEngine(_yes, name="b")
    reply = FallbackEngine(first, second).decide_sync("s", QUESTION, options=ReadOptions(timeout_s=1.0))
    assert reply is not None and reply.engine == "b" and first.sync_calls == 1
    assert FallbackEngine(first, ScriptedEngine(_yes, name="async")).decide_sync("s", QUESTION) is None


def test_the_chain_accepts_only_what_every_engine_accepts() -> None:
    wide = ScriptedEngine(_yes, name="a", limits=EngineLimits(max_questions=64, accepts_images=True, max_options=77))
    narrow = ScriptedEngine(_yes, name="b", limits=EngineLimits(max_questions=8, min_options=3, max_read_chars=4000))
    limits = FallbackEngine(wide, narrow).limits
    assert limits == EngineLimits(max_questions=8, min_options=3, max_options=77, max_read_chars=4000)


async def test_closing_the_chain_closes_every_engine_even_when_one_fails_to() -> None:
    closed: list[str] = []

    class Closing(ScriptedEngine):
        async def aclose(self) -> None:
            closed.append(self.name)
            if self.name == "a":
                raise RuntimeError("close failed")

    with pytest.raises(RuntimeError):
        await FallbackEngine(Closing(_yes, name="a"), Closing(_yes, name="b")).aclose()
    assert closed == ["a", "b"]


async def test_a_dead_loopback_engine_behind_a_breaker_falls_back_to_a_live_one_within_one_deadline() -> None:
    async with running_jev_server(None) as dead, running_jev_server("jev") as alive:
        dead.script(*[Reply(500, {"error": "down"}, headers={"retry-after-ms": "1"})] * 6)
        breaker = CircuitBreaker("jev:dead", failures=2, open_s=60.0)
        primary = BreakerEngine(JevEngine(JevSettings(base_url=dead.url, profile="jev", max_retries=2)), breaker)
        secondary = JevEngine(JevSettings(base_url=alive.url, profile="jev"))
        secondary.name = "jev:alive"
        chain = FallbackEngine(primary, secondary)
        try:
            replies: list[EngineReply] = []
            for _ in range(10):
                started = time.monotonic()
                replies.append(await chain.decide("Refund me", QUESTION, options=ReadOptions(timeout_s=2.0)))
                assert time.monotonic() - started < 2.0 + 1.0  # within the one budget, plus a generous bound
            assert {r.engine for r in replies} == {"jev:alive"}
            assert len(dead.requests) == 6 and breaker.state == "open"  # two calls of three attempts, then skipped
            assert len(alive.requests) == 10
        finally:
            await chain.aclose()


# --- System 2 ----------------------------------------------------------------------------------


async def test_a_chat_chain_falls_back_on_an_overloaded_provider_and_says_which_model_answered() -> None:
    first = ScriptedChat(replies=[EngineHTTPError(529, "overloaded")], name="anthropic", model="claude")
    second = ScriptedChat(replies=[ChatResult(content="ok", model="gpt")], name="openai", model="gpt")
    chain = FallbackChatEngine(first, second)
    result = await chain.complete([HumanMessage("hi")], timeout_s=1.0)
    assert result.model == "gpt" and chain.model == "claude" and chain.name == "fallback:anthropic,openai"
    [call] = second.calls
    assert call["timeout_s"] is not None and call["timeout_s"] <= 1.0


async def test_a_chat_chain_does_not_fall_back_on_a_bad_request() -> None:
    second = ScriptedChat(replies=[ChatResult(content="ok", model="gpt")])
    with pytest.raises(EngineHTTPError):
        await FallbackChatEngine(ScriptedChat(replies=[EngineHTTPError(400, "bad schema")]), second).complete([])
    assert not second.calls


async def test_a_chat_chain_does_not_redo_a_tool_loop_that_already_ran_a_tool() -> None:
    ran: list[str] = []

    async def runner(call: ToolCall) -> ToolOutcome:
        ran.append(call.name)
        return ToolOutcome(content="sent")

    class ToolThenFail(ScriptedChat):
        async def complete(self, messages: Any, *, tool_runner: Any = None, **kw: Any) -> ChatResult:
            await tool_runner(ToolCall(id="1", name="send_email", args={}))
            raise EngineTimeout("slow after the tool")

    second = ScriptedChat(replies=[ChatResult(content="ok", model="gpt")])
    with pytest.raises(EngineTimeout):
        await FallbackChatEngine(ToolThenFail(), second).complete([], tool_runner=runner)
    assert ran == ["send_email"] and not second.calls


def test_a_chat_chain_shows_a_base_url_only_when_every_engine_shares_it() -> None:
    local = ScriptedChat(base_url="http://127.0.0.1:8000/v1")
    assert FallbackChatEngine(local, ScriptedChat(base_url="http://127.0.0.1:8000/v1")).base_url == local.base_url
    # A local_only task must not escalate through a chain that may leave the allow-list.
    assert FallbackChatEngine(local, ScriptedChat()).base_url is None
