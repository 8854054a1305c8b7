"""Prometheus metrics, one registry per app (tests build many apps in one process).

Escalation rate is a ratio of counters, as Prometheus prefers::

    sum by (task) (rate(fastslow_escalations_total[5m])) / sum by (task) (rate(fastslow_decisions_total[5m]))

Two kinds of series. Counters and histograms count what *this replica* decided since it started:
sum them across instances. The ``fastslow_log_*`` and ``fastslow_drift*`` gauges are figures of the
*shared decision log* (every replica's decisions, every tenant's), which each replica reads again
every ``metrics.refresh_s`` seconds (``fastslow.api._monitor``): every replica reports the same
value, so take ``max`` across instances, never ``sum``.

No label carries a tenant, a key or request text: label values come from the policy file (task
names), the engine registry, or small fixed sets.

Under ``fastslow serve --workers N`` each worker is a process of its own, and one scrape reaches one
of them. prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, which the supervisor
sets before it starts the workers) keeps every worker's counters and histograms in files there, and
the worker that answers a scrape reports their sum: a dead worker's counts stay in the sum, so the
counters never go backwards when a worker is replaced. The breaker gauge is each live worker's worst
state (``livemax``); the ``fastslow_log_*`` gauges are the answering worker's own reading of the log.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from fastslow.router import Decision, polling
from fastslow.router.engine_api import CallRecord

if TYPE_CHECKING:
    from fastslow.api._compose import Runtime
    from fastslow.api.store import LogSummary
    from fastslow.policies.tuning import Drift

__all__ = ["BREAKER_REFRESH_S", "ApiMetrics", "LogFigures", "breaker_states"]

log = logging.getLogger("fastslow.api")

BREAKER_REFRESH_S = 5.0
"""How often a worker of several writes its breakers' states for the others' scrapes."""

_TIMEOUTS = frozenset({"EngineTimeout", "TimeoutError", "CancelledError"})
"""A call's failures (``CallRecord.error``) that are timeouts: a cancelled call was cut off at its caller's deadline."""
_BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DRIFT_FIGURES = {
    # fastslow_drift_figure{figure=...}: Drift.figures[key][part], the numbers `report drift` prints.
    "coverage": ("coverage", "now"),
    "coverage_fitted": ("coverage", "fitted"),
    "kept_accuracy": ("kept_accuracy", "now"),
    "kept_accuracy_target": ("kept_accuracy", "target"),
    "ece": ("ece", "now"),
    "ece_limit": ("ece", "limit"),
}


class LogFigures(Collector):
    """The shared log's figures per task, as gauges: a snapshot the monitor replaces whole.

    A custom collector rather than ``Gauge`` objects: a scrape sees one refresh's figures or the
    next's, never half of each, and a task that left the window (or lost its ``fitted:`` record)
    simply has no series, with nothing to remove label by label.
    """

    def __init__(self) -> None:
        self._summaries: dict[str, LogSummary] = {}
        self._refreshed: float | None = None
        self._drift: dict[str, Drift] = {}
        self._drift_checked: float | None = None

    def set_summaries(self, summaries: Mapping[str, LogSummary]) -> None:
        """Every task's summary of the window (tasks with no decision in it left out)."""
        self._summaries = dict(summaries)
        self._refreshed = time.time()

    def set_drift(self, drift: Mapping[str, Drift]) -> None:
        """Every fitted task's ``report drift`` result."""
        self._drift = dict(drift)
        self._drift_checked = time.time()

    def collect(self) -> Iterator[Metric]:
        summaries, drift = self._summaries, self._drift
        decisions = GaugeMetricFamily(
            "fastslow_log_decisions",
            "Decisions in the shared log over the window (metrics.window_s, whole hours), every replica and tenant.",
            labels=["task"],
        )
        kept = GaugeMetricFamily(
            "fastslow_log_kept_share",
            "Share of the window's logged decisions System 1 kept (not escalated, not sent to review); 0 to 1.",
            labels=["task"],
        )
        cost = GaugeMetricFamily(
            "fastslow_log_system2_cost_usd",
            "What the window's logged System-2 calls cost, in US dollars (calls to priced models).",
            labels=["task"],
        )
        saved = GaugeMetricFamily(
            "fastslow_log_saved_usd",
            "Estimated saving over the window against sending every decision to System 2: kept decisions times "
            "the window's mean System-2 call cost (fastslow tune's definition); absent while no call was priced.",
            labels=["task"],
        )
        for task, summary in sorted(summaries.items()):
            decisions.add_metric([task], summary.decisions)
            if summary.kept_share is not None:
                kept.add_metric([task], summary.kept_share)
            cost.add_metric([task], summary.system2_cost_usd)
            if summary.saved_usd is not None:
                saved.add_metric([task], summary.saved_usd)
        yield from (decisions, kept, cost, saved)
        refresh = GaugeMetricFamily(
            "fastslow_log_refreshed_timestamp_seconds",
            "When this replica last read the fastslow_log_* figures from the log (Unix time).",
        )
        if self._refreshed is not None:
            refresh.add_metric([], self._refreshed)
        yield refresh
        refit = GaugeMetricFamily(
            "fastslow_drift",
            "fastslow report drift for each task with a fitted: record: 1 when it says refit, 0 when not.",
            labels=["task"],
        )
        figures = GaugeMetricFamily(
            "fastslow_drift_figure",
            "The figures behind fastslow_drift: coverage (kept share) now and fitted, accuracy of kept decisions "
            "and its target, ECE and its limit; each only when report drift could judge it.",
            labels=["task", "figure"],
        )
        for task, result in sorted(drift.items()):
            refit.add_metric([task], 1.0 if result.refit else 0.0)
            for name, (key, part) in _DRIFT_FIGURES.items():
                group = result.figures.get(key)
                value = group.get(part) if isinstance(group, dict) else None
                if isinstance(value, int | float) and math.isfinite(value):
                    figures.add_metric([task, name], float(value))
        yield from (refit, figures)
        checked = GaugeMetricFamily(
            "fastslow_drift_checked_timestamp_seconds",
            "When this replica last ran the drift check (Unix time).",
        )
        if self._drift_checked is not None:
            checked.add_metric([], self._drift_checked)
        yield checked


def breaker_states(runtime: Runtime) -> dict[str, str]:
    """Every network System-1 engine's and System-2 model's breaker state, as the gauge names them."""
    states: dict[str, str] = {name: snap.state for name, snap in runtime.engines.breakers().items()}
    return states | {f"system2:{ref}": snap.state for ref, snap in runtime.chats.breakers().items()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


class ApiMetrics:
    """The API's metrics, registered in their own ``CollectorRegistry``.

    Where ``PROMETHEUS_MULTIPROC_DIR`` is set (a worker of ``fastslow serve --workers N``), ``render``
    reports every worker's figures from that directory (the module docstring).
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # prometheus-client reads the same variable when it is first imported to choose where values
        # live (memory, or files there), so the two always agree within a process.
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
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
        self.escalation_reasons = Counter(
            "fastslow_escalations_by_reason",
            "Decisions System 1 did not keep, by task and reason (low_confidence, engine_error, ...; a check's "
            "review verdict counts as reason review), as the decision log's kept share counts them.",
            ["task", "reason"],
            registry=self.registry,
        )
        self.system2_cost = Counter(
            "fastslow_system2_cost_usd",
            "What System-2 calls cost, in US dollars, by task (calls to models with a price in system2.prices).",
            ["task"],
            registry=self.registry,
        )
        self.decision_latency = Histogram(
            "fastslow_decision_latency_seconds",
            "Time to settle one task's decisions for a request (a check's rules are settled together), System 2 "
            "included, by task and the system that settled them (2 when any of them went to System 2).",
            ["task", "system"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.log_figures = LogFigures()
        self.registry.register(self.log_figures)
        self.breaker_state = Gauge(
            "fastslow_engine_breaker_state",
            "Each network System-1 engine's and System-2 model's (engine=\"system2:<ref>\") circuit breaker on this "
            "replica: 0 closed, 1 half-open, 2 open.",
            ["engine"],
            registry=self.registry,
            multiprocess_mode="livemax",  # the worst state of the live workers' breakers
        )

    def observe_breakers(self, states: Mapping[str, str]) -> None:
        """Set the breaker gauge from ``{engine: state}`` (read when metrics are scraped)."""
        for engine, state in states.items():
            self.breaker_state.labels(engine=engine).set(_BREAKER_LEVELS[state])

    def observe_decisions(self, decisions: list[Decision], *, elapsed_s: float | None = None) -> None:
        """Count one task's decisions for a request; ``elapsed_s`` is how long settling them took
        (``fastslow_decision_latency_seconds``). Engine calls are counted as they are made (``observe_call``)."""
        for decision in decisions:
            self.decisions.labels(decision.task, str(decision.system), decision.verdict or "none").inc()
            if decision.system == 2:
                self.escalations.labels(decision.task, "system2").inc()
                if decision.cost_usd is not None:
                    self.system2_cost.labels(decision.task).inc(decision.cost_usd)
            elif decision.escalate:
                self.escalations.labels(decision.task, "unresolved").inc()
            if decision.system != 1 or decision.escalate or decision.verdict == "review":
                # The decision log's rule (store._rollup): a review goes to a person, its own reason.
                reason = "review" if decision.verdict == "review" else decision.reason
                self.escalation_reasons.labels(decision.task, reason).inc()
        if elapsed_s is not None and decisions:
            system = str(max(d.system for d in decisions))
            self.decision_latency.labels(decisions[0].task, system).observe(elapsed_s)

    def observe_call(self, call: CallRecord) -> None:
        """Count one System-1 engine call as it was made (``observe_calls``): its latency, or its failure.

        One call answers every question of a task, whichever rules or callers share it (coalescing
        reports a shared call once), so a failed call is one error, not one per decision; a call a
        breaker refused was never made and counts nowhere here (``fastslow_engine_breaker_state``).
        """
        if call.system != 1:
            return
        if call.error:
            kind = "timeout" if call.error in _TIMEOUTS else "error"
            self.engine_errors.labels(call.engine, kind).inc()
        else:
            self.engine_latency.labels(call.engine).observe((call.ended_ns - call.started_ns) / 1e9)

    def observe_engine_call(self, engine: str, latency_ms: float | None, *, error: str | None = None) -> None:
        """Count a direct engine call (the Jev gateway): its latency, or its failure kind."""
        if error is not None:
            self.engine_errors.labels(engine, error).inc()
        elif latency_ms is not None:
            self.engine_latency.labels(engine).observe(latency_ms / 1000.0)

    @contextlib.asynccontextmanager
    async def observing_breakers(
        self, states: Callable[[], Mapping[str, str]], *, every_s: float = BREAKER_REFRESH_S
    ) -> AsyncIterator[None]:
        """Under workers, write ``states()`` every ``every_s`` seconds while the block runs.

        A scraper keeps its connection open, so one worker answers every scrape: the others'
        breakers reach the gauge only if they write them on their own. Alone, a process writes
        them when scraped (``/metrics``) and this does nothing.
        """
        if not self.multiprocess:
            yield
            return

        async def observe() -> None:
            self.observe_breakers(states())

        async with polling(
            observe, every_s, name="fastslow-breaker-gauge", log=log, failure="breaker gauge", at_once=True
        ):
            yield

    @property
    def multiprocess(self) -> bool:
        """Whether this process is one of several workers whose figures ``render`` sums."""
        return self._multiprocess_dir is not None

    def render(self) -> bytes:
        """The registry in Prometheus' text format; under workers, every worker's figures summed."""
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        self._forget_dead_workers(self._multiprocess_dir)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self._multiprocess_dir)  # type: ignore[no-untyped-call]
        registry.register(self.log_figures)
        return generate_latest(registry)

    @staticmethod
    def _forget_dead_workers(path: str) -> None:
        # A live gauge's file is kept until its process is marked dead; uvicorn's supervisor has no
        # hook for that, so the worker answering a scrape drops the files of workers that are gone.
        for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
            pid = os.path.basename(name).removesuffix(".db").rsplit("_", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                mark_process_dead(int(pid), path)  # type: ignore[no-untyped-call]
