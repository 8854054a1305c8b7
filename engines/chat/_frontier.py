"""``Frontier``: the router's ``ChatSource``, giving a configured ``ChatEngine`` per model reference.

A provider with neither a key nor a base URL is simply not configured: ``chat_for`` returns
``None`` and the router records "no frontier model configured", so everything runs offline.

Which engine serves a reference:

    openai:MODEL     -> OpenAIResponsesEngine when the base URL is OpenAI's own (none set, or
                        api.openai.com), else OpenAIChatEngine (vLLM, llama.cpp, proxies);
                        ``openai_api`` forces one or the other
    local:MODEL      -> OpenAIChatEngine on ``local_base_url``
    anthropic:MODEL  -> AnthropicChatEngine

Each model is behind its own circuit breaker (``system2.breaker``), and a reference with a fallback
chain (``system2.fallbacks``) gets a ``FallbackChatEngine`` over the chain's configured models, so
an outage or an open breaker moves on to the next model within the same budget.

Every engine gets the thought sink's callback when ``thought_sink`` is set; the sink keeps a
thought only while a task that opted in (``keep_thoughts``) is running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Literal, TypeAlias
from urllib.parse import urlsplit

import httpx2

from fastslow.router.engine_api import (
    BreakerChatEngine,
    BreakerSnapshot,
    ChatEngine,
    CircuitBreaker,
    FallbackChatEngine,
    TracedChatEngine,
)
from fastslow.router.settings import System2Settings

from ._ref import ModelRef, Provider
from ._thoughts import ThoughtSink

# Each provider's engine (and with it the provider's SDK, about 3 s of imports for both) loads when
# a reference to that provider is first resolved: a router whose System 2 is never asked, or asks
# one provider only, pays for no other SDK at start.

__all__ = ["Frontier", "OpenAIApi", "provider_configured"]

logger = logging.getLogger(__name__)

OpenAIApi: TypeAlias = Literal["auto", "responses", "chat"]
"""The API ``openai:`` references speak; ``auto`` picks Responses for OpenAI itself only."""

_OPENAI_HOST = "api.openai.com"

_Build = Callable[[ModelRef, "Frontier"], ChatEngine | None]


def _configured(value: object, env: str | None = None) -> bool:
    return value is not None or bool(env and os.environ.get(env))


def provider_configured(provider: Provider, settings: System2Settings) -> bool:
    """Whether ``settings`` (or the SDK's environment variables) configure ``provider``: the one rule
    ``Frontier`` builds its engines by, readable without building one (no SDK is imported)."""
    if provider == "openai":
        return _configured(settings.openai_api_key, "OPENAI_API_KEY") or _configured(
            settings.openai_base_url, "OPENAI_BASE_URL"
        )
    if provider == "anthropic":
        return _configured(settings.anthropic_api_key, "ANTHROPIC_API_KEY") or _configured(
            settings.anthropic_base_url, "ANTHROPIC_BASE_URL"
        )
    return bool(settings.local_base_url)


def _speaks_responses(settings: System2Settings, api: OpenAIApi) -> bool:
    if api != "auto":
        return api == "responses"
    # OpenAI-compatible servers (vLLM, llama.cpp, most proxies) speak Chat Completions, not Responses.
    base_url = settings.openai_base_url or os.environ.get("OPENAI_BASE_URL")
    return not base_url or urlsplit(base_url).hostname == _OPENAI_HOST


def _openai(ref: ModelRef, frontier: Frontier) -> ChatEngine | None:
    settings = frontier.settings
    if not provider_configured("openai", settings):
        logger.info("no frontier model configured for %s: set system2.openai_api_key or OPENAI_API_KEY", ref)
        return None
    from ._openai import OpenAIChatEngine
    from ._responses import OpenAIResponsesEngine

    engine = OpenAIResponsesEngine if _speaks_responses(settings, frontier.openai_api) else OpenAIChatEngine
    return engine(settings, ref, http_client=frontier.http_client, on_thought=frontier.on_thought(ref))


def _local(ref: ModelRef, frontier: Frontier) -> ChatEngine | None:
    if not provider_configured("local", frontier.settings):
        logger.info("no self-hosted model configured for %s: set system2.local_base_url", ref)
        return None
    from ._openai import OpenAIChatEngine

    return OpenAIChatEngine(
        frontier.settings, ref, http_client=frontier.http_client, on_thought=frontier.on_thought(ref)
    )


def _anthropic(ref: ModelRef, frontier: Frontier) -> ChatEngine | None:
    settings = frontier.settings
    if not provider_configured("anthropic", settings):
        logger.info("no frontier model configured for %s: set system2.anthropic_api_key or ANTHROPIC_API_KEY", ref)
        return None
    from ._anthropic import AnthropicChatEngine

    return AnthropicChatEngine(settings, ref, http_client=frontier.http_client, on_thought=frontier.on_thought(ref))


_BUILDERS: dict[Provider, _Build] = {"openai": _openai, "anthropic": _anthropic, "local": _local}


class Frontier:
    """A ``ChatSource`` over the System-2 settings; one engine per model reference, built on first use.

    Args:
        settings: the ``system2`` settings (default model, keys, base URLs, budget, retries,
            prices, thought sink).
        http_client: an ``httpx2.AsyncClient`` every engine sends through (tests pass one); the
            caller keeps ownership.
        openai_api: the API ``openai:`` references speak: ``auto`` (Responses on OpenAI's own
            base URL, Chat Completions on any other), ``responses`` or ``chat``.
    """

    def __init__(
        self,
        settings: System2Settings,
        *,
        http_client: httpx2.AsyncClient | None = None,
        openai_api: OpenAIApi = "auto",
    ) -> None:
        self.settings = settings
        self.http_client = http_client
        self.openai_api = openai_api
        self.thoughts = ThoughtSink.from_settings(settings)
        """The debugging sink, ``None`` unless ``settings.thought_sink`` is set."""
        self._engines: dict[str, ChatEngine | None] = {}
        self._chains: dict[str, ChatEngine | None] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._fallbacks = {
            str(ModelRef.parse(primary, key=f"system2.fallbacks.{primary}")): [
                ModelRef.parse(f, key=f"system2.fallbacks.{primary}") for f in fallbacks
            ]
            for primary, fallbacks in settings.fallbacks.items()
        }

    def on_thought(self, ref: ModelRef) -> Callable[[str], None] | None:
        """The thought callback for engines serving ``ref``; ``None`` when no sink is configured."""
        return self.thoughts.for_model(str(ref)) if self.thoughts is not None else None

    def chat_for(self, ref: str | None) -> ChatEngine | None:
        """The engine for ``ref`` (``settings.default`` when ``None``), or ``None`` when its provider is not configured.

        Raises:
            ConfigError: the reference is malformed.
        """
        parsed = self._parse(ref)
        key = str(parsed)
        if key not in self._chains:
            chain = [self._guarded(parsed)] + [self._guarded(f) for f in self._fallbacks.get(key, ())]
            engines = [engine for engine in chain if engine is not None]
            self._chains[key] = (
                None if not engines else engines[0] if len(engines) == 1 else FallbackChatEngine(*engines)
            )
        return self._chains[key]

    def _guarded(self, ref: ModelRef) -> ChatEngine | None:
        """The engine for ``ref`` alone, behind its breaker; ``None`` when its provider is not configured."""
        key = str(ref)
        if key not in self._engines:
            engine = _BUILDERS[ref.provider](ref, self)
            if engine is not None:
                engine = TracedChatEngine(engine, provider=ref.provider)
            settings = self.settings.breaker
            if engine is not None and settings.enabled:
                breaker = self._breakers[key] = CircuitBreaker(
                    key, failures=settings.failures, open_s=settings.open_s, probes=settings.probes
                )
                engine = BreakerChatEngine(engine, breaker)
            self._engines[key] = engine
        return self._engines[key]

    def breakers(self) -> dict[str, BreakerSnapshot]:
        """The state of each System-2 model's breaker built so far, by model reference."""
        return {ref: breaker.snapshot() for ref, breaker in sorted(self._breakers.items())}

    def answerable(self, ref: str | None) -> bool:
        """Whether a configured model of ``chat_for(ref)``'s chain is not behind an open breaker now (readiness)."""
        parsed = self._parse(ref)
        self.chat_for(ref)  # builds the chain's engines and breakers
        for model in (parsed, *self._fallbacks.get(str(parsed), ())):
            key = str(model)
            breaker = self._breakers.get(key)
            if self._engines.get(key) is not None and (breaker is None or breaker.snapshot().state != "open"):
                return True
        return False

    def _parse(self, ref: str | None) -> ModelRef:
        return ModelRef.parse(ref, key="escalate_to") if ref else ModelRef.parse(self.settings.default)

    async def aclose(self) -> None:
        """Close every engine built so far."""
        engines, self._engines = self._engines, {}
        self._chains.clear()
        for engine in engines.values():
            if engine is not None:
                await engine.aclose()
