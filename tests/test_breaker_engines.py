"""A hanging engine cut off at its budget counts against its breaker; a caller who leaves early does not.

The router, the coalescer and ``ask_system2`` stop waiting for an engine by cancelling the call at its
budget, and their timers start a moment before the engine's own, so a hanging engine is cancelled
before it can raise ``EngineTimeout``. Both breaker wrappers must still count it, or a hanging engine
would be asked on every request for the whole outage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

from fastslow.engines.jev import JevEngine
from fastslow.router import Noul, ReadOptions
from fastslow.router._escalate import ask_system2
from fastslow.router._fallback import FallbackChatEngine
from fastslow.router.engine_api import BreakerChatEngine, BreakerEngine, ChatResult, CircuitBreaker, ToolSpec
from fastslow.router.settings import JevSettings

from fakes.jev_server import running_jev_server
from fakes.scripted import ScriptedChat

QUESTION = Noul(instructions="Does the customer ask for a refund?")
BUDGET_S = 0.3
EARLY_S = 0.02
"""When a caller who leaves early leaves: far inside every budget here."""


class HangingChat:
    """A System-2 engine that never answers (a provider that accepted the connection and went silent)."""

    name = "hanging-chat"
    model = "hanging-1"
    base_url: str | None = "https://api.frontier.example/v1"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: Any = None,
    ) -> ChatResult:
        del messages, tools, schema, timeout_s, tool_runner
        self.calls += 1
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    async def aclose(self) -> None:
        return None


def _guarded_hanging_chat() -> tuple[HangingChat, BreakerChatEngine]:
    inner = HangingChat()
    return inner, BreakerChatEngine(inner, CircuitBreaker("system2:hanging", failures=2, open_s=60.0))


async def test_escalations_to_a_hanging_system2_cut_off_at_their_budget_open_its_breaker() -> None:
    inner, chat = _guarded_hanging_chat()
    for _ in range(2):
        answer = await ask_system2(chat, QUESTION, "I want my money back", timeout_s=BUDGET_S)
        assert answer.option is None and answer.detail == f"System 2 gave no answer within {BUDGET_S:g} s"
    assert chat.breaker.state == "open"

    answer = await ask_system2(chat, QUESTION, "I want my money back", timeout_s=BUDGET_S)
    assert answer.option is None and answer.detail.startswith("System 2 could not be reached")
    assert inner.calls == 2  # the open breaker refused the third at once


async def test_escalations_whose_caller_left_early_leave_a_system2_breaker_closed() -> None:
    inner, chat = _guarded_hanging_chat()
    for _ in range(3):
        task = asyncio.create_task(ask_system2(chat, QUESTION, "I want my money back", timeout_s=BUDGET_S))
        await asyncio.sleep(EARLY_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert chat.breaker.state == "closed" and inner.calls == 3


async def test_a_call_without_a_budget_is_never_cut_off_so_its_cancellation_never_counts() -> None:
    inner, chat = _guarded_hanging_chat()
    for _ in range(3):
        task = asyncio.create_task(chat.complete([], timeout_s=None))
        await asyncio.sleep(EARLY_S * 3)  # long for a call, but there is no budget to have spent
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert chat.breaker.state == "closed" and inner.calls == 3


async def test_once_a_hanging_primarys_breaker_opens_escalations_go_to_its_fallback_without_waiting() -> None:
    inner, primary = _guarded_hanging_chat()
    fallback = ScriptedChat(
        respond=lambda _messages, _schema: ChatResult(content="", structured={"answer": "yes"}, model="fb-1")
    )
    chain = FallbackChatEngine(primary, BreakerChatEngine(fallback, CircuitBreaker("system2:fb", failures=2)))
    for _ in range(2):  # the hanging primary takes the whole budget: nothing is left for the fallback
        answer = await ask_system2(chain, QUESTION, "I want my money back", timeout_s=BUDGET_S)
        assert answer.option is None
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await ask_system2(chain, QUESTION, "I want my money back", timeout_s=BUDGET_S)
    assert answer.option == "yes" and answer.model == "fb-1"
    assert loop.time() - started < BUDGET_S / 2 and inner.calls == 2


async def test_a_hanging_system1_cut_off_at_its_budget_counts_as_a_timeout_a_caller_leaving_early_does_not() -> None:
    async with running_jev_server("structured") as server:
        server.fault("hang")
        jev = JevEngine(JevSettings(base_url=server.url, profile="structured", max_retries=0))
        engine = BreakerEngine(jev, CircuitBreaker("jev", failures=2, open_s=60.0))
        questions = {"refund": QUESTION}
        options = ReadOptions(timeout_s=BUDGET_S)
        try:
            for _ in range(3):
                task = asyncio.create_task(engine.decide("s", questions, options=options))
                await asyncio.sleep(EARLY_S)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert engine.breaker.state == "closed"
            for _ in range(2):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(BUDGET_S):  # as router/_router.py waits for it
                        await engine.decide("s", questions, options=options)
            assert engine.breaker.state == "open"
        finally:
            server.clear_fault()
            await engine.aclose()
