"""The log monitor: the shared log's figures (every tenant's) and the drift check, read into the gauges.

A real decision log (SQLite, and PostgreSQL where reachable) holds known decisions; the monitor
reads them with the console's summary and ``report drift``'s function, as ``fastslow serve`` does.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fastslow.api._monitor import LogMonitor, fitted_tasks
from fastslow.api.app._metrics import ApiMetrics
from fastslow.api.store import DecisionStore
from fastslow.policies import load_policy
from fastslow.router import Decision, Settings
from fastslow.router.settings import MetricsSettings

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

POLICY = """\
tasks:
  support:
    kind: route
    routes:
      billing: Charges and refunds.
      technical: Errors and crashes.
    fitted:
      thresholds:
        by: fastslow tune
        date: "2026-12-01T00:00:00Z"
        target_accuracy: 0.9
        held_out: {kept: 0.5, accuracy: 0.95, lower_bound: 0.92}
  triage:
    kind: route
    routes:
      bug: Something is broken.
      question: How do I ...?
"""


def a_decision(*, kept: bool, task: str = "support", **changes: object) -> Decision:
    fields: dict[str, object] = {
        "task": task,
        "question": task,
        "outcome": "billing" if kept else None,
        "system": 1,
        "reason": "confident" if kept else "low_confidence",
        "escalate": not kept,
        "confidence": 0.95 if kept else 0.6,
        "probabilities": {"billing": 0.95, "technical": 0.05} if kept else {"billing": 0.6, "technical": 0.4},
        "engine": "embedded",
        "latency_ms": 8.0,
    }
    fields.update(changes)
    return Decision(**fields)  # type: ignore[arg-type]


def monitor_for(store: DecisionStore, url: str, policy: Path, metrics: ApiMetrics, **every: float) -> LogMonitor:
    settings = Settings(database_url=url, policy_file=policy, metrics=MetricsSettings(**every))
    in_force = load_policy(policy)
    return LogMonitor(store, metrics.log_figures, settings=settings, policy=lambda: in_force, policy_path=policy)


def a_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


async def test_the_summary_sums_every_tenant_when_none_is_named(store: DecisionStore) -> None:
    since = datetime.now(UTC) - timedelta(minutes=5)
    await store.record(a_decision(kept=True), tenant="acme", state="a")
    await store.record(a_decision(kept=False), tenant="globex", state="b")
    await store.record(a_decision(kept=True, task="triage"), tenant="globex", state="c")
    every = await store.summary(tenant=None, task="support", since=since)
    assert every.tenant is None and (every.decisions, every.kept) == (2, 1)
    assert (await store.summary(tenant="acme", task="support", since=since)).decisions == 1
    assert await store.summary_tasks(tenant=None) == ["support", "triage"]
    assert await store.summary_tasks(tenant="acme") == ["support"]
    # Only tasks with decisions from since's hour on.
    assert await store.summary_tasks(tenant=None, since=datetime.now(UTC) + timedelta(hours=2)) == []


async def test_a_refresh_sets_each_tasks_gauges_from_the_whole_log(
    store: DecisionStore,
    database_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    for i in range(4):
        await store.record(a_decision(kept=i < 3), tenant="acme", state=f"a{i}")
    await store.record(
        a_decision(kept=False, system=2, escalate=False, outcome="technical", cost_usd=0.04), tenant="globex", state="g"
    )
    metrics = ApiMetrics()
    summaries = await monitor_for(store, database_url, a_policy(tmp_path), metrics).refresh()
    assert set(summaries) == {"support"}  # triage has no decision in the window: no series
    value = metrics.registry.get_sample_value
    assert value("fastslow_log_decisions", {"task": "support"}) == 5
    assert value("fastslow_log_kept_share", {"task": "support"}) == pytest.approx(3 / 5)
    assert value("fastslow_log_system2_cost_usd", {"task": "support"}) == pytest.approx(0.04)
    # The console's figure: three kept decisions, each a System-2 call of 0.04 USD not made.
    assert value("fastslow_log_saved_usd", {"task": "support"}) == pytest.approx(summaries["support"].saved_usd)
    assert value("fastslow_log_saved_usd", {"task": "support"}) == pytest.approx(0.12)
    assert value("fastslow_log_decisions", {"task": "triage"}) is None


async def test_the_drift_check_reports_each_fitted_task_as_report_drift_does(
    store: DecisionStore,
    database_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    # System 1 keeps 90 % where the fit kept 50 % held out: the traffic changed (a coverage shift).
    for i in range(40):
        await store.record(a_decision(kept=i % 10 != 0), tenant="acme" if i % 2 else "globex", state=f"s{i}")
    policy = a_policy(tmp_path)
    assert fitted_tasks(load_policy(policy)) == ["support"]
    metrics = ApiMetrics()
    results = await monitor_for(store, database_url, policy, metrics).check_drift()
    assert set(results) == {"support"} and results["support"].refit
    assert any(line.startswith("DRIFT coverage") for line in results["support"].lines)
    value = metrics.registry.get_sample_value
    assert value("fastslow_drift", {"task": "support"}) == 1
    assert value("fastslow_drift_figure", {"task": "support", "figure": "coverage"}) == pytest.approx(0.9)
    assert value("fastslow_drift_figure", {"task": "support", "figure": "coverage_fitted"}) == pytest.approx(0.5)
    assert value("fastslow_drift", {"task": "triage"}) is None  # nothing fitted: skipped


async def test_a_task_without_drift_reads_zero(store: DecisionStore, database_url: str, tmp_path: Path) -> None:  # noqa: F811
    for i in range(40):
        await store.record(a_decision(kept=i % 2 == 0), tenant="acme", state=f"s{i}")
    metrics = ApiMetrics()
    results = await monitor_for(store, database_url, a_policy(tmp_path), metrics).check_drift()
    assert not results["support"].refit
    assert metrics.registry.get_sample_value("fastslow_drift", {"task": "support"}) == 0


async def test_running_refreshes_in_the_background_on_its_interval(
    store: DecisionStore,
    database_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    metrics = ApiMetrics()
    monitor = monitor_for(store, database_url, a_policy(tmp_path), metrics, refresh_s=0.05, drift_s=0.05)
    value = metrics.registry.get_sample_value
    async with monitor.running():
        deadline = time.monotonic() + 30
        # Both rounds run at once on entry; a decision written later shows up on a later refresh.
        while value("fastslow_drift", {"task": "support"}) is None:
            assert time.monotonic() < deadline, "no drift round ran"
            await asyncio.sleep(0.02)
        assert value("fastslow_log_decisions", {"task": "support"}) is None
        await store.record(a_decision(kept=True), tenant="acme", state="late")
        while value("fastslow_log_decisions", {"task": "support"}) != 1:
            assert time.monotonic() < deadline, "the refresh never saw the new decision"
            await asyncio.sleep(0.02)
    assert value("fastslow_log_kept_share", {"task": "support"}) == 1.0
