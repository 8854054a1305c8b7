"""Engines by name: ``ENGINES[name](settings)`` builds a configured ``DecisionEngine``.

Factories import their engine lazily, so choosing the Jev client never loads the CPU models and
the embedded engine never imports the OpenAI SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from router import ConfigError, DecisionEngine, EngineName, Settings

__all__ = ["ENGINES", "LEARNS_FROM_EXAMPLES", "build_engine"]


def _embedded(settings: Settings) -> DecisionEngine:
    from .embedded import EmbeddedEngine

    return EmbeddedEngine.from_settings(settings.embedded)


def _sparrow(settings: Settings) -> DecisionEngine:
    del settings  # the zero-shot model has no knobs
    from .embedded import SparrowEngine

    return SparrowEngine()


def _examples(settings: Settings) -> DecisionEngine:
    from .embedded import ExampleEngine

    if settings.embedded.examples is None:
        raise ConfigError("the examples engine needs an examples file", key="embedded.examples")
    return ExampleEngine.from_settings(settings.embedded)


def _jev(settings: Settings) -> DecisionEngine:
    from .jev import JevEngine

    return JevEngine(settings.jev)


def _openai_decisions(settings: Settings) -> DecisionEngine:
    from .openai_decisions import OpenAIDecisionsEngine

    return OpenAIDecisionsEngine(settings.openai_decisions)


def _logprob(settings: Settings) -> DecisionEngine:
    from .logprob import LogprobEngine

    return LogprobEngine(settings.logprob)


ENGINES: dict[EngineName, Callable[[Settings], DecisionEngine]] = {
    "embedded": _embedded,
    "sparrow": _sparrow,
    "examples": _examples,
    "jev": _jev,
    "openai-decisions": _openai_decisions,
    "logprob": _logprob,
}
LEARNS_FROM_EXAMPLES: frozenset[str] = frozenset({"embedded", "examples", "sparrow"})
"""Engines the pool trains on the policy's examples (sparrow is zero-shot but shares their limits)."""

assert set(ENGINES) == set(get_args(EngineName)), "every EngineName needs a factory"


def build_engine(settings: Settings, name: EngineName | None = None) -> DecisionEngine:
    """Build the engine ``name`` (default ``settings.engine``) from ``settings``."""
    return ENGINES[name or settings.engine](settings)
