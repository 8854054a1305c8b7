"""Prometheus metrics, one registry per app (tests build many apps in one process).

Escalation rate is a ratio of counters, as Prometheus prefers::

    sum by (task) (rate(fastslow_escalations_total[5m])) / sum by (task) (rate(fastslow_decisions_total[5m]))

No label carries a tenant, a key or request text: label values come from the policy file (task
names), the engine registry, or small fixed sets.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fastslow.router import Decision

__all__ = ["ApiMetrics"]

_BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ApiMetrics:
    """The API's metrics, registered in their own ``CollectorRegistry``."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.decisions = Counter(
            "fastslow_decisions",
            "Decisions recorded, by task, the system that settled them (1 or 2) and the verdict of checks.",
            ["task", "system", "verdict"],
            registry=self.registry,
        )
        self.escalations = Counter(
            "fastslow_escalations",
            "Decisions System 1 did not settle: answered by System 2, or left unresolved.",
            ["task", "result"],
            registry=self.registry,
        )
        self.engine_latency = Histogram(
            "fastslow_engine_latency_seconds",
            "System-1 engine latency per call.",
            ["engine"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.engine_errors = Counter(
            "fastslow_engine_errors",
            "System-1 engine calls that failed or timed out.",
            ["engine", "kind"],
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "fastslow_policy_reloads", "Policy files swapped in by hot reload.", registry=self.registry
        )
        self.policy_reload_failures = Counter(
            "fastslow_policy_reload_failures",
            "Policy file changes not put in force (unreadable, invalid, or their engines failed to train).",
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "fastslow_rate_limited_requests", "Requests refused with 429.", registry=self.registry
        )
        self.auth_throttled = Counter(
            "fastslow_auth_throttled",
            "Failed API keys and sign-ins refused with 429: their client address or key prefix failed too often.",
            registry=self.registry,
        )
        self.learned = Counter(
            "fastslow_learned_examples",
            "Examples offered to learning tasks, by what became of them (added, duplicate, refused, ...).",
            ["task", "result"],
            registry=self.registry,
        )
        self.retrains = Counter(
            "fastslow_learning_retrains",
            "Engines retrained on learned examples by this replica.",
            registry=self.registry,
        )
        self.breaker_state = Gauge(
            "fastslow_engine_breaker_state",
            "Each network System-1 engine's and System-2 model's (engine=\"system2:<ref>\") circuit breaker on this "
            "replica: 0 closed, 1 half-open, 2 open.",
            ["engine"],
            registry=self.registry,
        )

    def observe_breakers(self, states: Mapping[str, str]) -> None:
        """Set the breaker gauge from ``{engine: state}`` (read when metrics are scraped)."""
        for engine, state in states.items():
            self.breaker_state.labels(engine=engine).set(_BREAKER_LEVELS[state])

    def observe_decisions(self, decisions: list[Decision], *, engine: str) -> None:
        """Count one request's decisions; ``engine`` names the engine when a failed call did not say."""
        calls: set[tuple[str, float]] = set()
        for decision in decisions:
            self.decisions.labels(decision.task, str(decision.system), decision.verdict or "none").inc()
            if decision.system == 2:
                self.escalations.labels(decision.task, "system2").inc()
            elif decision.escalate:
                self.escalations.labels(decision.task, "unresolved").inc()
            if decision.reason in ("engine_error", "timeout"):
                kind = "timeout" if decision.reason == "timeout" else "error"
                self.engine_errors.labels(decision.engine or engine, kind).inc()
            elif decision.engine:
                calls.add((decision.engine, decision.latency_ms))
        # One engine call answers all the questions of a task, and each of its decisions carries the
        # same latency: observe each call once, not once per rule.
        for name, latency_ms in calls:
            self.engine_latency.labels(name).observe(latency_ms / 1000.0)

    def observe_engine_call(self, engine: str, latency_ms: float | None, *, error: str | None = None) -> None:
        """Count a direct engine call (the Jev gateway): its latency, or its failure kind."""
        if error is not None:
            self.engine_errors.labels(engine, error).inc()
        elif latency_ms is not None:
            self.engine_latency.labels(engine).observe(latency_ms / 1000.0)

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
