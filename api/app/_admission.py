"""Admission to System-1 engines: a bounded number of requests per engine, the rest queued fairly.

The API hands its routers an engine source whose engines wait at a ``FairGate`` before they
decide: at most ``limits.local_engine_concurrency`` requests use one in-process engine at once
(``remote_engine_concurrency`` for network engines), up to ``limits.engine_queue`` more wait, admitted
round-robin across tenants, and the next one is refused at once with ``Overloaded`` (a 503 with
Retry-After) instead of waiting without bound. Waiting counts against the request's deadline. The
gates are per process on purpose: they guard this replica's CPU and connections.

Coalescing comes first: calls about one state that share an engine call (``CoalescingEngine``)
take one place at the gate between them, for the call actually sent; a caller that joins a shared
call adds no work to the engine, so it neither waits at the gate nor is refused by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fastslow.router import EngineSource, EngineTimeout, Image, PolicySet, Question, ReadOptions, State
from fastslow.router.engine_api import CoalescingEngine, DecisionEngine, EngineLimits, EngineReply, FairGate
from fastslow.router.settings import LimitsSettings

__all__ = ["LOCAL_ENGINES", "GatedEngines"]

LOCAL_ENGINES: frozenset[str] = frozenset({"embedded", "sparrow", "examples"})
"""Engines that run in this process, on its CPU."""


class _GatedEngine:
    """An engine whose calls wait for a place at its gate first."""

    def __init__(self, inner: DecisionEngine, gate: FairGate) -> None:
        self._inner = inner
        self._gate = gate
        self.name = inner.name
        self.limits: EngineLimits = inner.limits
        # The learned examples' versions the router records with each decision (``Decision.examples_version``).
        self.examples_versions: Mapping[str, str] = getattr(inner, "examples_versions", None) or {}

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        try:
            async with self._gate.admit():
                return await self._inner.decide(state, questions, images=images, options=options)
        except TimeoutError:
            raise EngineTimeout(
                f"the request's deadline passed while waiting for the engine ({self._gate.waiting} waiting)",
                engine=self.name,
            ) from None

    async def aclose(self) -> None:
        """The pool owns the engine; nothing to release here."""


class GatedEngines:
    """An ``EngineSource`` over ``inner`` whose engines are admitted through one gate per engine name.

    Args:
        inner: the runtime's engine pool.
        limits: concurrency and queue sizes.
        default: the engine a task without one uses (``Settings.engine``).
    """

    def __init__(self, inner: EngineSource, limits: LimitsSettings, *, default: str) -> None:
        self._inner = inner
        self._limits = limits
        self._default = default
        self._gates: dict[str, FairGate] = {}

    def gate(self, name: str | None) -> FairGate:
        """The gate of engine ``name`` (the default engine when ``None``)."""
        engine = name or self._default
        gate = self._gates.get(engine)
        if gate is None:
            local = engine in LOCAL_ENGINES
            capacity = self._limits.local_engine_concurrency if local else self._limits.remote_engine_concurrency
            gate = self._gates[engine] = FairGate(
                engine, capacity=capacity, queue=self._limits.engine_queue, weights=self._limits.tenant_weights
            )
        return gate

    def engine_for(self, name: str | None, policy: PolicySet) -> DecisionEngine:
        engine = self._inner.engine_for(name, policy)
        if isinstance(engine, CoalescingEngine):
            return engine.via(_GatedEngine(engine.inner, self.gate(name)))
        return _GatedEngine(engine, self.gate(name))
