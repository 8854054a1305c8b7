"""Engines by name: ``ENGINES[name](build)`` makes a configured ``DecisionEngine`` from an ``EngineBuild``.

Every engine is made here, by ``build_engine`` for one-off use (the command line) and by the
``EnginePool`` a running router uses. Factories import their engine lazily, so choosing the Jev
client never loads the CPU models and the embedded engine never imports the OpenAI SDK. ``ENGINES``
holds the shipped engines; any other name is an installed plugin's (``fastslow.engines`` entry
points), whose factory ``_plugins`` makes when the name is first built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, get_args

from fastslow.router import ConfigError, EngineName, PolicySet, Settings
from fastslow.router.engine_api import DecisionEngine

from ._learned import LearnedSet, merge_learned
from ._plugins import plugin_factory

if TYPE_CHECKING:
    from .embedded import EmbeddedModels, ExampleSet

__all__ = [
    "ENGINES",
    "LEARNS_FROM_EXAMPLES",
    "EngineBuild",
    "EngineFactory",
    "build_engine",
    "embedded_models_for",
    "examples_for",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineBuild:
    """What an engine factory makes its engine from."""

    settings: Settings
    examples: ExampleSet | None = None
    """The labelled examples an engine that learns from them trains on; ``None``: it has none."""
    models: EmbeddedModels | None = None
    """Loaded CPU models to share across engines; the embedded factories load their own when ``None``."""

    def embedded_models(self) -> EmbeddedModels:
        if self.models is not None:
            return self.models
        return embedded_models_for(self.settings)


def embedded_models_for(settings: Settings) -> EmbeddedModels:
    """CPU models whose embedding cache (and trained heads) live under the settings' data directory."""
    from .embedded import EmbeddedModels, default_cache_dir

    cache_dir = settings.embedded.cache_dir or default_cache_dir(settings.resolved_data_dir())
    return EmbeddedModels(settings.embedded, cache_dir=cache_dir)


EngineFactory: TypeAlias = Callable[[EngineBuild], DecisionEngine]


def _embedded(build: EngineBuild) -> DecisionEngine:
    return build.embedded_models().embedded_engine(build.examples)


def _sparrow(build: EngineBuild) -> DecisionEngine:
    return build.embedded_models().sparrow  # zero-shot: no knobs, no examples


def _examples(build: EngineBuild) -> DecisionEngine:
    if build.examples is None or not build.examples.questions:
        raise ConfigError(
            "the examples engine needs examples in the policy or an examples file", key="embedded.examples"
        )
    return build.embedded_models().example_engine(build.examples)


def _jev(build: EngineBuild) -> DecisionEngine:
    from .jev import JevEngine

    return JevEngine(build.settings.jev, max_reply_bytes=build.settings.limits.max_engine_reply_bytes)


def _openai_decisions(build: EngineBuild) -> DecisionEngine:
    from .openai_decisions import OpenAIDecisionsEngine

    return OpenAIDecisionsEngine(
        build.settings.openai_decisions, max_reply_bytes=build.settings.limits.max_engine_reply_bytes
    )


def _logprob(build: EngineBuild) -> DecisionEngine:
    from .logprob import LogprobEngine

    return LogprobEngine(build.settings.logprob, max_reply_bytes=build.settings.limits.max_engine_reply_bytes)


# Keyed by the shipped names' Literal (the house style's registry); plugins' names are open.
ENGINES: dict[EngineName, EngineFactory] = {
    "embedded": _embedded,
    "sparrow": _sparrow,
    "examples": _examples,
    "jev": _jev,
    "openai-decisions": _openai_decisions,
    "logprob": _logprob,
}
LEARNS_FROM_EXAMPLES: frozenset[str] = frozenset({"embedded", "examples", "sparrow"})
"""Engines trained on the policy's examples (sparrow is zero-shot but shares their limits)."""

assert set(ENGINES) == set(get_args(EngineName)), "every EngineName needs a factory"


def examples_for(
    settings: Settings, policy: PolicySet | None = None, learned: LearnedSet | None = None
) -> ExampleSet | None:
    """The examples engines learn from: the settings' examples file with ``policy``'s over it.

    A question the policy gives examples for takes them from the policy alone, plus what its task
    learned from escalations (``learned``, see ``merge_learned``). ``None`` when there are none at all.

    Raises:
        ConfigError: a bad examples file.
    """
    from .embedded import ExampleSet, QuestionExamples, load_examples

    questions: dict[str, QuestionExamples] = {}
    if settings.embedded.examples is not None:
        questions.update(load_examples(settings.embedded.examples).questions)
    if policy is not None:
        roles = policy.question_roles()
        own = policy.question_examples()
        merged = merge_learned(policy, own, learned) if learned is not None else own
        for name, examples in merged.items():
            role = roles.get(name)
            questions[name] = QuestionExamples(
                name=name,
                examples=dict(examples),
                none_option=role.none_option if role else None,
                violation=role.violation if role else None,
                background=role.background if role else True,
            )
    if not questions:
        return None
    file = str(settings.embedded.examples) if settings.embedded.examples is not None else None
    return ExampleSet(
        questions=questions,
        source=(policy.source if policy is not None else None) or file,
        versions=dict(learned.versions) if learned is not None else {},
    )


def build_engine(settings: Settings, name: str | None = None) -> DecisionEngine:
    """Build the engine ``name`` (default ``settings.engine``), trained on the settings' examples file.

    Raises:
        ConfigError: an engine name not installed, a plugin that does not load or speaks another
            engine-API version, or a setting the engine cannot start with.
    """
    engine_name = name or settings.engine
    factory = _factory(engine_name)
    examples = examples_for(settings) if engine_name in LEARNS_FROM_EXAMPLES else None
    return factory(EngineBuild(settings=settings, examples=examples))


def _factory(name: str) -> EngineFactory:
    # Names are checked where they are read (settings, policy files); a plugin's name is loaded
    # here, and the rest (such as a task built in code naming no installed engine) is refused,
    # instead of quietly answering with another engine.
    if name in ENGINES:
        return ENGINES[name]
    return plugin_factory(name)
