"""The engines a running router uses, built once and rebuilt when the policy's examples change.

Engines that learn from examples (the embedded engines) are trained on the policy file's examples
merged with the examples file from settings, and share one set of loaded models; network engines
are built once and shared.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from fastslow.router import EngineName, PolicySet, Settings
from fastslow.router.engine_api import DecisionEngine

from ._registry import LEARNS_FROM_EXAMPLES, EngineBuild, _factory, examples_for

if TYPE_CHECKING:
    from .embedded import EmbeddedModels

__all__ = ["EnginePool", "needs_examples"]

log = logging.getLogger("fastslow.engines")


def needs_examples(name: EngineName | None, *, default: EngineName = "embedded") -> frozenset[str]:
    """Question kinds an engine cannot answer well without labelled examples.

    The embedded engines are near chance on yes/no questions zero-shot (measured on XSTest and the
    prompt-injection set), so policy rules for them must come with examples.
    """
    return frozenset({"noul"}) if (name or default) in LEARNS_FROM_EXAMPLES else frozenset()


class EnginePool:
    """An ``EngineSource``: the engine for a task's engine name under a given policy.

    Args:
        settings: what every engine is configured from.
        models: loaded CPU models to share (tests pass one); loaded on first need when omitted.
    """

    def __init__(self, settings: Settings, *, models: EmbeddedModels | None = None) -> None:
        self._settings = settings
        self._models = models
        self._engines: dict[tuple[EngineName, str], DecisionEngine] = {}
        self._lock = threading.Lock()

    def engine_for(self, name: EngineName | None, policy: PolicySet) -> DecisionEngine:
        """The engine ``name`` (the settings' engine when ``None``) trained for ``policy``.

        Raises:
            ConfigError: an unknown engine name, or an engine that cannot start with these settings.
        """
        engine_name = name or self._settings.engine
        factory = _factory(engine_name)
        learns = engine_name in LEARNS_FROM_EXAMPLES
        key = (engine_name, policy.version if learns else "")
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                if not learns:
                    engine = factory(EngineBuild(settings=self._settings))
                else:
                    examples = examples_for(self._settings, policy)
                    engine = factory(
                        EngineBuild(settings=self._settings, examples=examples, models=self._shared_models())
                    )
                    trained = len(examples.questions) if examples is not None else 0
                    log.info(
                        "built %s engine for policy %s (%d questions with examples)",
                        engine_name,
                        policy.version,
                        trained,
                    )
                self._engines[key] = engine
        return engine

    def _shared_models(self) -> EmbeddedModels:
        if self._models is None:
            from .embedded import EmbeddedModels

            self._models = EmbeddedModels(self._settings.embedded)
        return self._models

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

    async def aclose(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in {id(e): e for e in engines}.values():
            await engine.aclose()
