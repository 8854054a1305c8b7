"""``Frontier``: the router's ``ChatSource``, giving a configured ``ChatEngine`` per model reference.

A provider with neither a key nor a base URL is simply not configured: ``chat_for`` returns
``None`` and the router records "no frontier model configured", so everything runs offline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import httpx2

from router import ChatEngine, ConfigError, System2Settings

from ._openai import OpenAIChatEngine
from ._ref import ModelRef, Provider

__all__ = ["Frontier"]

logger = logging.getLogger(__name__)

_Build = Callable[[ModelRef, System2Settings, httpx2.AsyncClient | None], ChatEngine | None]


def _configured(value: object, env: str | None = None) -> bool:
    return value is not None or bool(env and os.environ.get(env))


def _openai(ref: ModelRef, settings: System2Settings, http_client: httpx2.AsyncClient | None) -> ChatEngine | None:
    keyed = _configured(settings.openai_api_key, "OPENAI_API_KEY")
    if not (keyed or _configured(settings.openai_base_url, "OPENAI_BASE_URL")):
        logger.info("no frontier model configured for %s: set system2.openai_api_key or OPENAI_API_KEY", ref)
        return None
    return OpenAIChatEngine(settings, ref, http_client=http_client)


def _local(ref: ModelRef, settings: System2Settings, http_client: httpx2.AsyncClient | None) -> ChatEngine | None:
    if not settings.local_base_url:
        logger.info("no self-hosted model configured for %s: set system2.local_base_url", ref)
        return None
    return OpenAIChatEngine(settings, ref, http_client=http_client)


def _anthropic(ref: ModelRef, settings: System2Settings, http_client: httpx2.AsyncClient | None) -> ChatEngine | None:
    del http_client
    if _configured(settings.anthropic_api_key, "ANTHROPIC_API_KEY") or _configured(
        settings.anthropic_base_url, "ANTHROPIC_BASE_URL"
    ):
        raise ConfigError(
            f"{ref}: the anthropic engine arrives with the System-2 issue; use an openai: or local: model for now",
            key="system2.default",
        )
    logger.info("no frontier model configured for %s: the anthropic engine is not available yet", ref)
    return None


_BUILDERS: dict[Provider, _Build] = {"openai": _openai, "anthropic": _anthropic, "local": _local}


class Frontier:
    """A ``ChatSource`` over the System-2 settings; one engine per model reference, built on first use.

    Args:
        settings: the ``system2`` settings (default model, keys, base URLs, budget, retries).
        http_client: an ``httpx2.AsyncClient`` every engine sends through (tests pass one); the
            caller keeps ownership.
    """

    def __init__(self, settings: System2Settings, *, http_client: httpx2.AsyncClient | None = None) -> None:
        self.settings = settings
        self._http_client = http_client
        self._engines: dict[str, ChatEngine | None] = {}

    def chat_for(self, ref: str | None) -> ChatEngine | None:
        """The engine for ``ref`` (``settings.default`` when ``None``), or ``None`` when its provider is not configured.

        Raises:
            ConfigError: the reference is malformed, or names anthropic while an Anthropic key or
                base URL is set (that engine is not written yet).
        """
        parsed = ModelRef.parse(ref, key="escalate_to") if ref else ModelRef.parse(self.settings.default)
        key = str(parsed)
        if key not in self._engines:
            self._engines[key] = _BUILDERS[parsed.provider](parsed, self.settings, self._http_client)
        return self._engines[key]

    async def aclose(self) -> None:
        """Close every engine built so far."""
        engines, self._engines = self._engines, {}
        for engine in engines.values():
            if engine is not None:
                await engine.aclose()
