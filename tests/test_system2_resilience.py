"""System 2 behind breakers and fallback chains, over real loopback servers speaking the SDKs' wire.

``Frontier`` puts each model reference behind its own breaker (``system2.breaker``) and gives a
reference with ``system2.fallbacks`` a chain: the OpenAI-compatible server failing moves the call
to the Anthropic one within the same budget, the open breaker stops the calls reaching the dead
server, and a recovered server closes it again. Through the router, a check whose System 1 is down
and whose task says ``on_failure: escalate`` is answered by the fallback model.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from pydantic import SecretStr

from fastslow.engines.chat import Frontier
from fastslow.router import ConfigError, EngineHTTPError
from fastslow.router.engine_api import CircuitOpen, FallbackChatEngine
from fastslow.router.settings import BreakerSettings, System2Settings

from fakes.anthropic_server import anthropic_server
from fakes.anthropic_server import text as anthropic_text
from fakes.openai_server import error, openai_server
from fakes.openai_server import text as openai_text

PRIMARY = "local:qwen"
FALLBACK = "anthropic:claude-sonnet-4-6"
FAILURES = 3


def _settings(openai_url: str, anthropic_url: str | None, **overrides: Any) -> System2Settings:
    values: dict[str, Any] = {
        "default": PRIMARY,
        "local_base_url": openai_url,
        "anthropic_base_url": anthropic_url,
        "anthropic_api_key": SecretStr("sk-ant") if anthropic_url else None,
        "max_retries": 0,
        "timeout_s": 5.0,
        "fallbacks": {PRIMARY: [FALLBACK]},
        "breaker": BreakerSettings(failures=FAILURES, open_s=0.3),
    }
    return System2Settings(**(values | overrides))


async def test_a_failing_model_falls_back_and_its_breaker_spares_it() -> None:
    with (
        openai_server(respond=lambda _body: error(503, "overloaded")) as (openai_url, dead),
        anthropic_server(respond=lambda _body: anthropic_text("from the fallback")) as (anthropic_url, alive),
    ):
        frontier = Frontier(_settings(openai_url, anthropic_url))
        chat = frontier.chat_for(None)
        assert isinstance(chat, FallbackChatEngine)
        try:
            results = [await chat.complete([HumanMessage("hello")]) for _ in range(20)]
            states = {ref: snap.state for ref, snap in frontier.breakers().items()}
        finally:
            await frontier.aclose()
    assert {r.content for r in results} == {"from the fallback"}
    assert {r.model for r in results} == {"claude-sonnet-4-6"}
    # The breaker opened after FAILURES calls: the rest never reached the dead server.
    assert len(dead.requests) == FAILURES
    assert len(alive.requests) == 20
    assert states == {PRIMARY: "open", FALLBACK: "closed"}


async def test_the_breaker_state_is_reported_and_closes_after_recovery() -> None:
    healthy = [False]

    def primary(_body: dict[str, Any]) -> Any:
        return openai_text("primary is back") if healthy[0] else error(500, "down")

    with openai_server(respond=primary) as (openai_url, server):
        frontier = Frontier(_settings(openai_url, None))
        chat = frontier.chat_for(None)
        assert chat is not None and not isinstance(chat, FallbackChatEngine)  # the fallback is not configured
        try:
            for _ in range(FAILURES):
                with pytest.raises(EngineHTTPError):
                    await chat.complete([HumanMessage("hello")])
            assert frontier.breakers()[PRIMARY].state == "open"
            assert not frontier.answerable(None)  # readiness: no model of the chain can answer now
            with pytest.raises(CircuitOpen):
                await chat.complete([HumanMessage("hello")])
            assert len(server.requests) == FAILURES
            healthy[0] = True
            time.sleep(0.35)  # open_s: the next call is the probe
            result = await chat.complete([HumanMessage("hello")])
            assert result.content == "primary is back"
            assert frontier.breakers()[PRIMARY].state == "closed" and frontier.answerable(None)
        finally:
            await frontier.aclose()


async def test_an_unconfigured_chain_is_no_model_and_a_bad_fallback_names_its_key() -> None:
    assert Frontier(System2Settings(fallbacks={"openai:gpt-5.5": [FALLBACK]})).chat_for(None) is None
    with pytest.raises(ConfigError) as caught:
        Frontier(System2Settings(fallbacks={"openai:gpt-5.5": ["claude"]}))
    assert caught.value.key == "system2.fallbacks.openai:gpt-5.5"


async def test_a_client_error_is_not_passed_down_the_chain() -> None:
    # A 400 is about the request: the fallback would refuse it too, and the breaker does not count it.
    with (
        openai_server(respond=lambda _body: error(400, "bad request")) as (openai_url, _dead),
        anthropic_server(respond=lambda _body: anthropic_text("unused")) as (anthropic_url, alive),
    ):
        frontier = Frontier(_settings(openai_url, anthropic_url))
        chat = frontier.chat_for(None)
        assert chat is not None
        try:
            for _ in range(FAILURES + 1):
                with pytest.raises(EngineHTTPError):
                    await chat.complete([HumanMessage("hello")])
            assert frontier.breakers()[PRIMARY].state == "closed"
        finally:
            await frontier.aclose()
    assert alive.requests == []
