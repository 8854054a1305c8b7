"""`fastslow report drift`: recent logged outcomes against what the task's fit promised (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import DecisionStore
from fastslow.router import Decision

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

runner = CliRunner()

POLICY = """\
tasks:
  support:
    kind: route
    routes:
      billing: Charges and refunds.
      technical: Errors and crashes.
    thresholds:
      min_confidence: 0.8
    fitted:
      thresholds:
        by: fastslow tune
        date: "2026-12-01T00:00:00Z"
        target_accuracy: 0.9
        held_out: {kept: 0.5, accuracy: 0.95, lower_bound: 0.92}
      calibration:
        by: fastslow calibrate
        date: "2026-12-01T00:00:00Z"
        held_out: {after: {ece: 0.02}}
"""


async def _log(url: str, n: int, *, kept_share: float, kept_accuracy: float, labelled: bool = True) -> None:
    rng = np.random.default_rng(1)
    store = await DecisionStore.open(url)
    try:
        for i in range(n):
            kept = rng.random() < kept_share
            right = rng.random() < (kept_accuracy if kept else 0.6)
            p = 0.95 if kept else 0.6
            decision = Decision(
                task="support",
                question="support",
                outcome="billing" if kept else None,
                system=1,
                reason="confident" if kept else "low_confidence",
                escalate=not kept,
                confidence=p,
                probabilities={"billing": p, "technical": 1 - p},
            )
            await store.record(decision, tenant="acme", state=f"m{i}")
            if labelled:
                await store.record_outcome(decision.id, tenant="acme", label="billing" if right else "technical")
    finally:
        await store.aclose()


def _drift(policy: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["report", "drift", "--policy", str(policy), "--task", "support"])
    return result.exit_code, result.output


@pytest.fixture
def policy(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def test_no_drift_when_the_log_matches_the_fit(policy: Path, database_url: str) -> None:  # noqa: F811
    asyncio.run(_log(database_url, 400, kept_share=0.5, kept_accuracy=0.96))
    code, out = _drift(policy)
    assert code == 0, out
    assert "no drift" in out and "coverage" in out and "accuracy of kept decisions" in out


def test_kept_decisions_less_accurate_than_promised_ask_for_a_refit(policy: Path, database_url: str) -> None:  # noqa: F811
    asyncio.run(_log(database_url, 400, kept_share=0.5, kept_accuracy=0.7))
    code, out = _drift(policy)
    assert code == 1, out
    assert "DRIFT accuracy of kept decisions" in out


def test_a_coverage_shift_asks_for_a_refit(policy: Path, database_url: str) -> None:  # noqa: F811
    asyncio.run(_log(database_url, 300, kept_share=0.9, kept_accuracy=0.97, labelled=False))
    code, out = _drift(policy)
    assert code == 1, out
    assert "DRIFT coverage" in out and "too few to judge" in out


def test_a_task_without_a_fit_is_refused(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.split("    fitted:")[0], encoding="utf-8")
    result = runner.invoke(app, ["report", "drift", "--policy", str(path), "--task", "support"])
    assert result.exit_code == 2 and "no fitted: record" in result.output
