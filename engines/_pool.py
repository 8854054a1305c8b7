"""The engines a running router uses, built once and retrained when the policy's examples change.

Engines that learn from examples (the embedded engine) are trained on the policy file's examples
merged with the examples file from settings; network engines are built once and shared.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from router import ConfigError, DecisionEngine, EngineName, PolicySet, Settings

from ._registry import ENGINES, LEARNS_FROM_EXAMPLES

__all__ = ["EnginePool", "needs_examples"]

log = logging.getLogger("fastslow.engines")


def needs_examples(name: str | None, *, default: str = "embedded") -> frozenset[str]:
    """Question kinds an engine cannot answer well without labelled examples.

    The embedded engines are near chance on yes/no questions zero-shot (measured on XSTest and the
    prompt-injection set), so policy rules for them must come with examples.
    """
    return frozenset({"noul"}) if (name or default) in LEARNS_FROM_EXAMPLES else frozenset()


class EnginePool:
    """An ``EngineSource``: the engine for a task's engine name under a given policy."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._engines: dict[tuple[str, str], DecisionEngine] = {}
        self._shared: dict[str, Any] = {}
        self._lock = threading.Lock()

    def engine_for(self, name: str | None, policy: PolicySet) -> DecisionEngine:
        engine_name: EngineName = name or self._settings.engine  # type: ignore[assignment]
        if engine_name not in ENGINES:
            engine_name = self._settings.engine
        key = (engine_name, policy.version if engine_name in LEARNS_FROM_EXAMPLES else "")
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = self._build(engine_name, policy)
                self._engines[key] = engine
        return engine

    def warm(self, policy: PolicySet) -> None:
        """Build (and train) the engines ``policy`` uses, so the first decision does not wait.

        Engines trained for other policy versions are dropped: after a reload only the new
        examples matter. (Their ``aclose`` is a no-op: they hold no connections.)
        """
        for name in {task.engine for task in policy.tasks.values()}:
            self.engine_for(name, policy)
        with self._lock:
            for key in [k for k in self._engines if k[1] and k[1] != policy.version]:
                del self._engines[key]

    def _build(self, name: EngineName, policy: PolicySet) -> DecisionEngine:
        if name not in LEARNS_FROM_EXAMPLES:
            return ENGINES[name](self._settings)
        from .embedded import (
            EmbeddedEngine,
            EmbeddingCache,
            ExampleEngine,
            ExampleSet,
            QuestionExamples,
            SparrowEngine,
            load_embedder,
            load_examples,
        )

        if "embedder" not in self._shared:
            self._shared["embedder"] = load_embedder(self._settings.embedded.embedder)
            self._shared["sparrow"] = SparrowEngine()
            self._shared["cache"] = EmbeddingCache()
        questions: dict[str, QuestionExamples] = {}
        if self._settings.embedded.examples is not None:
            questions.update(load_examples(self._settings.embedded.examples).questions)
        for qname, examples in policy.question_examples().items():
            questions[qname] = QuestionExamples(name=qname, examples=dict(examples))
        examples_engine = None
        if questions:
            examples_engine = ExampleEngine(
                ExampleSet(questions=questions, source=policy.source or None),
                self._shared["embedder"],
                cache=self._shared["cache"],
            )
        log.info("built %s engine for policy %s (%d questions with examples)", name, policy.version, len(questions))
        if name == "sparrow":
            return self._shared["sparrow"]  # type: ignore[no-any-return]
        if name == "examples":
            if examples_engine is None:
                raise ConfigError(
                    "the examples engine needs examples in the policy or an examples file", key="embedded.examples"
                )
            return examples_engine
        return EmbeddedEngine(
            sparrow=self._shared["sparrow"],
            embedder=self._shared["embedder"],
            examples=examples_engine,
            cache=self._shared["cache"],
        )

    async def aclose(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in {id(e): e for e in engines}.values():
            await engine.aclose()
