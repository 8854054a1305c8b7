"""``fastslow eval`` composed: the engines its settings build, passed into the library's evaluation run.

The run itself (planning, resuming, asking each row, writing predictions and the report) is
``fastslow.policies.evaluation.evaluate``; this builds what it asks: the policy's ``Router`` from
``build_runtime`` (or one without System 2), and the settings' engine for explicit rows, trained on
the settings' examples file alone.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from fastslow.engines import LEARNS_FROM_EXAMPLES, EnginePool, examples_for, needs_examples
from fastslow.policies import load_policy
from fastslow.policies.evaluation import (
    EXPLICIT_THRESHOLDS,
    NONE_OF_THESE,
    EvalOptions,
    Headline,
    RowEngine,
    RunInfo,
    TaskRouter,
    TrainingTexts,
    headline,
)
from fastslow.policies.evaluation import evaluate as run_evaluation
from fastslow.router import ConfigError, PolicySet, Router, Settings

from ._compose import Runtime, build_runtime

__all__ = ["EXPLICIT_THRESHOLDS", "NONE_OF_THESE", "EvalOptions", "Headline", "evaluate", "headline"]

# Sparrow is in LEARNS_FROM_EXAMPLES for its limits only: it is zero-shot and learns nothing.
_TRAINED_ENGINES = LEARNS_FROM_EXAMPLES - {"sparrow"}
# The explicit rows' engine is trained on the settings' examples file alone, not on a policy.
_NO_POLICY = PolicySet(tasks={}, version="")


async def evaluate(data: Path, out_dir: Path, *, settings: Settings, options: EvalOptions | None = None) -> RunInfo:
    """Answer every row of ``data`` and write ``predictions.jsonl``, ``run.json`` and the report to ``out_dir``.

    ``fastslow.policies.evaluation.evaluate`` with the engines ``settings`` build (``options`` are
    documented with ``EvalOptions``; its defaults when omitted).

    Raises:
        ConfigError: a bad argument, policy, examples or data file (``strict``: a bad row), or an
            ``out_dir`` holding another run; the message names the file, line or key.
    """
    return await run_evaluation(data, out_dir, settings=settings, deciders=EngineDeciders(settings), options=options)


class _NoSystem2:
    """A System 2 that is never there: escalated decisions stay escalated."""

    def chat_for(self, _ref: str | None) -> None:
        return None


class EngineDeciders:
    """``Deciders`` from settings: the runtime's router for task rows, the pool's engine for explicit ones."""

    def __init__(self, settings: Settings) -> None:
        # Rows are offline data, read again at every threshold and policy change: what the
        # embedded engine reads of them stays in its embedding cache (EmbeddedSettings.cache_states).
        embedded = settings.embedded.model_copy(update={"cache_states": True})
        self._settings = settings.model_copy(update={"embedded": embedded})
        self._runtime: Runtime | None = None
        self._pool: EnginePool | None = None

    def load_policy(self, path: Path) -> PolicySet:
        # Loaded as build_runtime loads it, so the rows are read against the tasks that will run them.
        settings = self._settings
        return load_policy(
            path,
            needs_examples=partial(needs_examples, default=settings.engine),
            default_engine=settings.engine,
        )

    def learns(self, engine: str) -> bool:
        return engine in _TRAINED_ENGINES

    def training_texts(self, policy: PolicySet | None) -> TrainingTexts:
        examples = examples_for(self._settings, policy)
        if examples is None:
            return {}
        return {
            name: [text for option in question.examples.values() for text in option]
            for name, question in examples.questions.items()
        }

    async def router(self, policy_path: Path, policy: PolicySet, *, system2: bool) -> TaskRouter:
        settings = self._settings.model_copy(update={"policy_file": policy_path})
        # Blocking: build_runtime trains the policy's engines.
        runtime = self._runtime = await asyncio.to_thread(build_runtime, settings)
        self._pool = runtime.engines
        if runtime.store.current.version != policy.version:
            raise ConfigError("the policy file changed while the run started; run it again", path=str(policy_path))
        if system2:
            return runtime.router
        return Router(lambda: runtime.store.current, runtime.engines, _NoSystem2())

    async def engine(self) -> RowEngine:
        pool = self._pool or EnginePool(self._settings)
        self._pool = pool
        return await asyncio.to_thread(pool.engine_for, self._settings.engine, _NO_POLICY)

    async def aclose(self) -> None:
        runtime, pool = self._runtime, self._pool
        self._runtime = self._pool = None
        if runtime is not None:
            await runtime.aclose()
        elif pool is not None:
            await pool.aclose()
