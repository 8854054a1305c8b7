"""The engines a running router uses, built once and rebuilt when the policy's or the learned examples change.

Engines that learn from examples (the embedded engines) are trained on the policy file's examples
merged with the examples file from settings, and share one set of loaded models; network engines
are built once and shared. Each engine is wrapped once in a ``CoalescingEngine`` (unless
``Settings.coalesce.enabled`` is off), so concurrent calls about one state from every caller of the
pool share engine calls. A network engine sits behind its circuit breaker, inside coalescing; an
engine with a fallback chain (``Settings.engine_fallbacks``) is a ``FallbackEngine`` over the chain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastslow.router import PolicySet, Settings
from fastslow.router.engine_api import (
    BreakerEngine,
    BreakerSnapshot,
    CircuitBreaker,
    CoalescingEngine,
    DecisionEngine,
    FallbackEngine,
    TracedEngine,
)

from ._learned import LearnedSet
from ._registry import LEARNS_FROM_EXAMPLES, EngineBuild, _factory, embedded_models_for, examples_for

if TYPE_CHECKING:
    from .embedded import EmbeddedModels

__all__ = ["EnginePool", "needs_examples"]

log = logging.getLogger("fastslow.engines")

_CHAINS = 64


def needs_examples(name: str | None, *, default: str = "embedded") -> frozenset[str]:
    """Question kinds an engine cannot answer well without labelled examples.

    The embedded engines are near chance on yes/no questions zero-shot (measured on XSTest and the
    prompt-injection set), so policy rules for them must come with examples.
    """
    return frozenset({"noul"}) if (name or default) in LEARNS_FROM_EXAMPLES else frozenset()


class EnginePool:
    """An ``EngineSource``: the engine for a task's engine name under a given policy.

    Engines that learn from examples are trained on the policy's examples and on the learned set in
    force (``train``); a new learned set is trained in the caller's thread while requests keep the
    engines trained before, and takes over for every engine in one step. A new policy is the same
    (``switch``): its engines are trained first, and the policy is put in force only then.

    Args:
        settings: what every engine is configured from.
        models: loaded CPU models to share (tests pass one); loaded on first need when omitted.
    """

    def __init__(self, settings: Settings, *, models: EmbeddedModels | None = None) -> None:
        self._settings = settings
        self._models = models
        self._engines: dict[tuple[str, str, str], DecisionEngine] = {}
        # One per network engine name, kept across rebuilds and reloads: an outage outlives a policy.
        self._breakers: dict[str, CircuitBreaker] = {}
        # Its own lock: engines are built under ``_lock`` (engine_for), and building one takes a breaker.
        self._breakers_lock = threading.Lock()
        self._chains: dict[tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]], FallbackEngine] = {}
        self._learned = LearnedSet()
        self._lock = threading.Lock()
        # One training at a time: a reload and a retrain at once would only contend for the CPU.
        self._training = threading.Lock()
        # The policy the engines in force were readied for (by warm or switch): a retrain asked for
        # with a policy read just before a reload trains this one, not the replaced one.
        self._policy: PolicySet | None = None

    @property
    def learned(self) -> LearnedSet:
        """The learned examples the engines in force were trained with."""
        return self._learned

    def engine_for(self, name: str | None, policy: PolicySet) -> DecisionEngine:
        """The engine ``name`` (the settings' engine when ``None``) trained for ``policy``.

        With a fallback chain for it in ``Settings.engine_fallbacks``, a ``FallbackEngine`` over the
        chain's engines (each one as ``engine_for`` would give it alone), made once per policy.

        Raises:
            ConfigError: an unknown engine name, or an engine that cannot start with these settings.
        """
        engine_name = name or self._settings.engine
        fallbacks = self._settings.engine_fallbacks.get(engine_name)
        if not fallbacks:
            return self.single_engine(engine_name, policy)
        chain = (engine_name, *fallbacks)
        key = (chain, tuple(self._key(n, policy, self._learned) for n in chain))
        found = self._chains.get(key)
        if found is None:
            if len(self._chains) >= _CHAINS:
                self._chains.clear()  # old policies' and learned sets' chains
            found = self._chains[key] = FallbackEngine(*(self.single_engine(n, policy) for n in chain))
        return found

    def single_engine(self, name: str | None, policy: PolicySet) -> DecisionEngine:
        """The engine ``name`` alone, without its fallbacks (``engine_for`` otherwise)."""
        engine_name = name or self._settings.engine
        learned = self._learned
        key = self._key(engine_name, policy, learned)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = self._build(engine_name, policy, learned)
                self._engines[key] = engine
        if isinstance(engine, CoalescingEngine):
            return engine.for_policy(policy.version)
        return engine

    def _key(self, name: str, policy: PolicySet, learned: LearnedSet) -> tuple[str, str, str]:
        if name not in LEARNS_FROM_EXAMPLES:
            return (name, "", "")
        return (name, policy.version, learned.key)

    def _build(self, name: str, policy: PolicySet, learned: LearnedSet) -> DecisionEngine:
        factory = _factory(name)
        if name not in LEARNS_FROM_EXAMPLES:
            # Traced innermost: a span per call made (a breaker's refusal is an event, a shared call one span).
            return self._coalesced(self._guarded(name, TracedEngine(factory(EngineBuild(settings=self._settings)))))
        examples = examples_for(self._settings, policy, learned)
        engine = factory(EngineBuild(settings=self._settings, examples=examples, models=self._shared_models()))
        log.info(
            "built %s engine for policy %s (%d questions with examples, learned set %s)",
            name,
            policy.version,
            len(examples.questions) if examples is not None else 0,
            learned.key or "empty",
        )
        return self._coalesced(TracedEngine(engine))

    def _guarded(self, name: str, engine: DecisionEngine) -> DecisionEngine:
        """A network engine behind its breaker (inside coalescing: one shared call counts once).

        In-process engines get none: their failures (a deadline passed under load) are this
        replica's own, and failing fast would not spare any server.
        """
        settings = self._settings.breaker
        if not settings.enabled:
            return engine
        with self._breakers_lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = self._breakers[name] = CircuitBreaker(
                    name, failures=settings.failures, open_s=settings.open_s, probes=settings.probes
                )
        return BreakerEngine(engine, breaker)

    def breakers(self) -> dict[str, BreakerSnapshot]:
        """The state of each network engine's breaker, for readiness and metrics."""
        with self._breakers_lock:
            breakers = dict(self._breakers)
        return {name: breaker.snapshot() for name, breaker in sorted(breakers.items())}

    def _coalesced(self, engine: DecisionEngine) -> DecisionEngine:
        settings = self._settings.coalesce
        return CoalescingEngine(engine, settings) if settings.enabled else engine

    def _shared_models(self) -> EmbeddedModels:
        if self._models is None:
            self._models = embedded_models_for(self._settings)
        return self._models

    def warm(self, policy: PolicySet) -> None:
        """Build (and train) the engines ``policy`` uses, so the first decision does not wait.

        Engines trained for other policy versions are dropped: after a reload only the new
        examples matter. (Their ``aclose`` is a no-op: they hold no connections.)
        """
        self.switch(policy, lambda: None)

    def switch(self, policy: PolicySet, publish: Callable[[], None]) -> None:
        """Train ``policy``'s engines, then call ``publish()`` (which puts the policy in force), then drop the old.

        Blocking: call it from a worker thread in async code (the policy watcher does). Training
        holds no lock a request takes, so requests keep being answered under the old policy and its
        engines until ``publish`` runs; a training that raises leaves both in force.
        """
        with self._training:
            learned = self._learned
            built: dict[tuple[str, str, str], DecisionEngine] = {}
            used = {task.engine or self._settings.engine for task in policy.tasks.values()}
            # A fallback is trained now too: built on the first failing request, its training would
            # spend that request's budget (and every request's, on a loaded replica) in an outage.
            chains = {n for name in used for n in (name, *self._settings.engine_fallbacks.get(name, ()))}
            for name in sorted(chains):
                key = self._key(name, policy, learned)
                with self._lock:
                    engine = self._engines.get(key)
                if engine is None and key not in built:
                    built[key] = self._build(name, policy, learned)
            with self._lock:
                self._engines.update(built)
            publish()
            self._policy = policy
            self._drop_others(policy, learned)

    def train(self, policy: PolicySet, learned: LearnedSet) -> None:
        """Train ``policy``'s engines on ``learned`` and make them the ones in force (blocking).

        Until this returns, requests get the engines trained on the previous learned set; then all
        of them switch at once. Call it from a worker thread in async code. When a reload put
        another policy in force since ``policy`` was read, that one is trained instead.
        """
        with self._training:
            if self._policy is not None:
                policy = self._policy
            names = {task.engine or self._settings.engine for task in policy.tasks.values()}
            built: dict[tuple[str, str, str], DecisionEngine] = {}
            for name in names & LEARNS_FROM_EXAMPLES:
                key = self._key(name, policy, learned)
                with self._lock:
                    engine = self._engines.get(key)
                built[key] = engine if engine is not None else self._build(name, policy, learned)
            with self._lock:
                self._engines.update(built)
                self._learned = learned
            self._drop_others(policy, learned)

    def _drop_others(self, policy: PolicySet, learned: LearnedSet) -> None:
        with self._lock:
            for key in [k for k in self._engines if k[1] and k[1:] != (policy.version, learned.key)]:
                del self._engines[key]

    async def aclose(self) -> None:
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for engine in {id(e): e for e in engines}.values():
            await engine.aclose()
