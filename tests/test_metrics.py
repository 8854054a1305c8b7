"""The API's Prometheus series: escalations by reason, System-2 cost, decision latency, and the log's gauges.

``ApiMetrics`` is driven directly with decisions (no server): each series is read back from its
registry as Prometheus would scrape it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastslow.api.app._metrics import ApiMetrics
from fastslow.api.store import LogSummary
from fastslow.policies.tuning import Drift
from fastslow.router import Decision
from fastslow.router.engine_api import CallRecord


def a_decision(**changes: object) -> Decision:
    fields: dict[str, object] = {
        "task": "support",
        "question": "support",
        "outcome": "billing",
        "system": 1,
        "reason": "confident",
        "confidence": 0.9,
        "engine": "embedded",
        "latency_ms": 12.0,
    }
    fields.update(changes)
    return Decision(**fields)  # type: ignore[arg-type]


def value(metrics: ApiMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def scraped(metrics: ApiMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the rendered text, by sample name: what a scrape would read."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def test_escalations_are_counted_by_reason_as_the_log_counts_them() -> None:
    metrics = ApiMetrics()
    metrics.observe_decisions(
        [
            a_decision(),  # kept: no reason counted
            a_decision(outcome=None, reason="low_confidence", escalate=True),
            a_decision(outcome=None, reason="low_confidence", escalate=True),
            a_decision(reason="small_margin", system=2, outcome="technical"),
            a_decision(outcome=None, reason="timeout", escalate=True, engine=""),
        ],
    )
    check = [a_decision(task="tool_safety", verdict="review", outcome="review", reason="confident")]
    metrics.observe_decisions(check)
    by_reason = "fastslow_escalations_by_reason_total"
    assert value(metrics, by_reason, task="support", reason="low_confidence") == 2
    assert value(metrics, by_reason, task="support", reason="small_margin") == 1
    assert value(metrics, by_reason, task="support", reason="timeout") == 1
    assert value(metrics, by_reason, task="support", reason="confident") is None
    # A review goes to a person, not System 2: its own reason, as in the decision log's rollups.
    assert value(metrics, by_reason, task="tool_safety", reason="review") == 1
    # The older series are untouched.
    assert value(metrics, "fastslow_escalations_total", task="support", result="unresolved") == 3
    assert value(metrics, "fastslow_escalations_total", task="support", result="system2") == 1
    # Engine calls are counted as they are made (observe_call), not from decisions.
    assert value(metrics, "fastslow_engine_errors_total", engine="embedded", kind="timeout") is None


def a_call(**changes: object) -> CallRecord:
    fields: dict[str, object] = {
        "system": 1,
        "engine": "jev:structured",
        "provider": "vllm",
        "operation": "chat",
        "request_model": "dgemma",
        "started_ns": 1_000_000_000,
        "ended_ns": 1_040_000_000,
    }
    fields.update(changes)
    return CallRecord(**fields)  # type: ignore[arg-type]


def test_engine_calls_are_counted_once_each_under_the_engines_own_name() -> None:
    metrics = ApiMetrics()
    # Six failed calls: one error each, whatever number of rules or decisions each one answered.
    for error in ["EngineUnavailable"] * 4 + ["EngineTimeout", "CancelledError"]:
        metrics.observe_call(a_call(error=error))
    metrics.observe_call(a_call())
    metrics.observe_call(a_call(system=2, engine="openai-chat", error="EngineUnavailable"))  # System 2: not here
    assert value(metrics, "fastslow_engine_errors_total", engine="jev:structured", kind="error") == 4
    assert value(metrics, "fastslow_engine_errors_total", engine="jev:structured", kind="timeout") == 2
    assert value(metrics, "fastslow_engine_errors_total", engine="openai-chat", kind="error") is None
    assert value(metrics, "fastslow_engine_latency_seconds_count", engine="jev:structured") == 1
    assert value(metrics, "fastslow_engine_latency_seconds_sum", engine="jev:structured") == pytest.approx(0.04)


def test_system_2_cost_adds_up_the_priced_calls_per_task() -> None:
    metrics = ApiMetrics()
    metrics.observe_decisions(
        [
            a_decision(system=2, reason="low_confidence", cost_usd=0.0125),
            a_decision(system=2, reason="low_confidence", cost_usd=0.0075),
            a_decision(system=2, reason="low_confidence", cost_usd=None),  # an unpriced model: no cost
            a_decision(cost_usd=None),
        ],
    )
    assert value(metrics, "fastslow_system2_cost_usd_total", task="support") == pytest.approx(0.02)
    assert value(metrics, "fastslow_system2_cost_usd_total", task="triage") is None


def test_decision_latency_is_one_observation_per_task_call_labelled_by_the_system_that_settled_it() -> None:
    metrics = ApiMetrics()
    metrics.observe_decisions([a_decision()], elapsed_s=0.02)
    metrics.observe_decisions([a_decision()], elapsed_s=0.2)
    # A check whose second rule went to System 2: the caller waited for System 2.
    rules = [a_decision(task="tool_safety"), a_decision(task="tool_safety", system=2, reason="low_confidence")]
    metrics.observe_decisions(rules, elapsed_s=1.5)
    metrics.observe_decisions([a_decision()])  # no time given: nothing observed
    name = "fastslow_decision_latency_seconds"
    assert value(metrics, f"{name}_count", task="support", system="1") == 2
    assert value(metrics, f"{name}_sum", task="support", system="1") == pytest.approx(0.22)
    assert value(metrics, f"{name}_bucket", task="support", system="1", le="0.025") == 1
    assert value(metrics, f"{name}_count", task="tool_safety", system="2") == 1
    assert value(metrics, f"{name}_count", task="tool_safety", system="1") is None
    # The per-engine histogram is fed by the engine calls themselves (observe_call), not by decisions.
    assert value(metrics, "fastslow_engine_latency_seconds_count", engine="embedded") is None


def _summary(task: str, **figures: object) -> LogSummary:
    now = datetime.now(UTC)
    return LogSummary(tenant=None, task=task, since=now - timedelta(hours=1), until=now, **figures)  # type: ignore[arg-type]


def test_the_log_figures_are_gauges_of_the_last_snapshot_only() -> None:
    metrics = ApiMetrics()
    assert "fastslow_log_kept_share" not in scraped(metrics)  # nothing read yet: no series, not zeros
    metrics.log_figures.set_summaries(
        {
            "support": _summary("support", decisions=10, kept=8, system2_costed=2, system2_cost_usd=0.5),
            "triage": _summary("triage", decisions=4, kept=1),  # no priced System-2 call: no saving
        }
    )
    assert value(metrics, "fastslow_log_decisions", task="support") == 10
    assert value(metrics, "fastslow_log_kept_share", task="support") == pytest.approx(0.8)
    assert value(metrics, "fastslow_log_system2_cost_usd", task="support") == pytest.approx(0.5)
    # Eight kept decisions at the window's mean of 0.25 USD per System-2 call.
    assert value(metrics, "fastslow_log_saved_usd", task="support") == pytest.approx(2.0)
    assert value(metrics, "fastslow_log_kept_share", task="triage") == pytest.approx(0.25)
    assert value(metrics, "fastslow_log_saved_usd", task="triage") is None
    assert value(metrics, "fastslow_log_refreshed_timestamp_seconds") == pytest.approx(
        datetime.now(UTC).timestamp(), abs=60
    )
    # The next refresh replaces the snapshot whole: a task that left the window has no series.
    metrics.log_figures.set_summaries({"triage": _summary("triage", decisions=2, kept=2)})
    assert value(metrics, "fastslow_log_decisions", task="support") is None
    assert value(metrics, "fastslow_log_kept_share", task="triage") == 1.0
    # No label names a tenant.
    assert all("tenant" not in labels for samples in scraped(metrics).values() for labels, _ in samples)


def test_drift_is_one_or_zero_per_fitted_task_with_its_finite_figures() -> None:
    metrics = ApiMetrics()
    metrics.log_figures.set_drift(
        {
            "support": Drift(
                task="support",
                refit=True,
                figures={"coverage": {"now": 0.9, "fitted": 0.5}, "decisions": 300, "sample": "all"},
            ),
            "triage": Drift(task="triage", refit=False, figures={"coverage": {"now": math.nan, "fitted": 0.7}}),
        }
    )
    assert value(metrics, "fastslow_drift", task="support") == 1
    assert value(metrics, "fastslow_drift", task="triage") == 0
    assert value(metrics, "fastslow_drift_figure", task="support", figure="coverage") == pytest.approx(0.9)
    assert value(metrics, "fastslow_drift_figure", task="support", figure="coverage_fitted") == pytest.approx(0.5)
    # No decisions logged: coverage is NaN in the report, and no sample here.
    assert value(metrics, "fastslow_drift_figure", task="triage", figure="coverage") is None
    assert value(metrics, "fastslow_drift_figure", task="triage", figure="coverage_fitted") == pytest.approx(0.7)
    assert value(metrics, "fastslow_drift_checked_timestamp_seconds") is not None


_WORKER = """
import asyncio, os, sys
from fastslow.api.app._metrics import ApiMetrics

async def main() -> None:
    metrics = ApiMetrics()
    assert metrics.multiprocess
    metrics.decisions.labels("support", "1", "none").inc(int(sys.argv[1]))
    state = sys.argv[2]
    async with metrics.observing_breakers(lambda: {"jev": state}, every_s=60):
        await asyncio.sleep(0)  # the first write happens on entering
    sys.stdout.write(metrics.render().decode())

asyncio.run(main())
"""


def test_under_workers_every_scrape_sums_the_workers_and_forgets_dead_ones_breakers(tmp_path: Path) -> None:
    # prometheus-client chooses where values live when it is first imported, so each "worker" is a
    # process of its own, as fastslow serve --workers spawns them, sharing one metrics folder.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def worker(decisions: int, breaker: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        done = subprocess.run(
            [sys.executable, "-c", _WORKER, str(decisions), breaker],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(done.stdout)
            for s in family.samples
        }

    worker(3, "open")  # a worker that counted 3 decisions, its breaker open, and is gone now
    seen = worker(4, "closed")
    decisions = ("fastslow_decisions_total", (("system", "1"), ("task", "support"), ("verdict", "none")))
    assert seen[decisions] == 7.0  # the dead worker's counts stay in the sum
    # Its breaker does not: only live workers' states count (0 closed, 2 open).
    assert seen[("fastslow_engine_breaker_state", (("engine", "jev"),))] == 0.0
    # The second worker dropped the first one's file when it rendered; its own stays until the next scrape.
    assert len(list(tmp_path.glob("gauge_livemax_*.db"))) == 1
