"""The console's figures and charts: calibration read as ``tune --from-log`` reads outcomes, bounded log
reads, time buckets, and SVG that draws every name as text."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from fastslow.api.console import ConsoleLog, calibration_figures
from fastslow.api.console._charts import Mark, distribution, escalations
from fastslow.api.console._figures import buckets
from fastslow.api.store import DecisionStore, HourFigures, LogSummary, StoredDecision, StoredOutcome
from fastslow.policies import load_policy
from fastslow.policies.evaluation import coverage_curve, ece, reliability
from fastslow.router import Decision, Task

from fakes.api_server import EXAMPLE_POLICY
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

NOW = datetime(2026, 3, 2, 12, 30, tzinfo=UTC)
POLICY = load_policy(EXAMPLE_POLICY, default_engine="embedded")
SUPPORT: Task = POLICY.tasks["support"]
SAFETY: Task = POLICY.tasks["tool_safety"]


def stored(n: int, *, top: float, outcome: str = "billing", **changes: Any) -> StoredDecision:
    rest = (1.0 - top) / 3
    probabilities = {"billing": rest, "technical": rest, "account": rest, "other": rest, outcome: top}
    fields: dict[str, Any] = {
        "id": f"{n:032x}",
        "tenant": "acme",
        "task": "support",
        "question": "support",
        "outcome": outcome,
        "system": 1,
        "reason": "confident",
        "escalate": False,
        "confidence": top,
        "threshold": 0.7,
        "probabilities": probabilities,
        "answers": probabilities,
        "verdict": None,
        "policy_version": "v1",
        "engine": "embedded",
        "model": "e5",
        "latency_ms": 9.0,
        "detail": "",
        "cost_usd": None,
        "created_at": NOW,
        "state_digest": "0" * 64,
        "state_text": None,
    }
    fields.update(changes)
    return StoredDecision(**fields)


def labelled(decision: StoredDecision, label: str | None, n: int = 0) -> StoredOutcome:
    return StoredOutcome(
        id=f"o{decision.id}{n}", decision_id=decision.id, label=label, system2_correct=None, note=None, created_at=NOW
    )


class FakeLog:
    """An ``OutcomeLog`` holding its pairs newest outcome first, as the store answers."""

    def __init__(self, pairs: Sequence[tuple[StoredDecision, StoredOutcome]]) -> None:
        self.pairs = list(pairs)
        self.asked: dict[str, Any] = {}

    async def outcomes(
        self, *, tenant: str | None = None, task: str | None = None, since: datetime | None = None, limit: int = 0
    ) -> list[tuple[StoredDecision, StoredOutcome]]:
        self.asked = {"tenant": tenant, "task": task, "since": since, "limit": limit}
        return self.pairs[:limit]

    async def aclose(self) -> None:
        raise AssertionError("the figures never close the log they are given")


def _sample(n: int, seed: int = 3) -> list[tuple[StoredDecision, StoredOutcome]]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        top = round(rng.uniform(0.3, 0.99), 3)
        right = rng.random() < top
        decision = stored(i, top=top)
        pairs.append((decision, labelled(decision, "billing" if right else "technical")))
    return pairs


async def test_with_every_outcome_at_weight_one_the_figures_are_the_evaluation_libraries() -> None:
    pairs = _sample(50)
    log = FakeLog(pairs)
    figures = await calibration_figures(log, SUPPORT, tenant="acme", since=NOW, limit=400, bins=10)
    confidence = np.array([d.confidence for d, _ in pairs])
    correct = np.array([float(o.label == "billing") for _, o in pairs])
    assert log.asked == {"tenant": "acme", "task": "support", "since": NOW, "limit": 400}
    assert (figures.labelled, figures.outcomes_read, figures.sample, figures.enough) == (50, 50, "all", True)
    assert figures.ece == pytest.approx(ece(confidence, correct, bins=10))
    assert figures.accuracy == pytest.approx(correct.mean())
    expected = reliability(confidence, correct, bins=10)
    assert [b.rows for b in figures.reliability] == expected.rows.tolist()
    for got, want_conf, want_acc in zip(figures.reliability, expected.confidence, expected.accuracy, strict=True):
        assert (got.confidence is None) == bool(np.isnan(want_conf))
        if got.confidence is not None:
            assert (got.confidence, got.accuracy) == pytest.approx((want_conf, want_acc))
    curve = coverage_curve(confidence, correct)
    assert [p.coverage for p in figures.coverage] == pytest.approx(curve.coverage.tolist())
    assert [p.accuracy for p in figures.coverage] == pytest.approx(curve.accuracy.tolist())
    assert [p.threshold for p in figures.coverage] == pytest.approx(curve.threshold.tolist())


async def test_an_audit_sample_weighs_its_decisions_and_leaves_other_kept_ones_out() -> None:
    audited = [stored(i, top=0.9, audit=True, audit_rate=0.1) for i in range(20)]
    escalated = [stored(100 + i, top=0.5, system=2, escalate=True, reason="low_confidence") for i in range(15)]
    unaudited = stored(200, top=0.95)  # kept, labelled outside the sample: would bias the figures
    pairs = [(d, labelled(d, "billing")) for d in audited[:18]]
    pairs += [(d, labelled(d, "technical")) for d in audited[18:]]
    pairs += [(d, labelled(d, "technical")) for d in escalated]
    pairs.append((unaudited, labelled(unaudited, "technical")))
    figures = await calibration_figures(FakeLog(pairs), SUPPORT, tenant="acme")
    assert (figures.sample, figures.labelled) == ("weighted", 35)
    # 20 audited at 1 / 0.1 (18 right), 15 escalations at 1 (none right: System 1 said billing).
    assert figures.accuracy == pytest.approx(180 / (200 + 15))
    assert sum(b.weight for b in figures.reliability) == pytest.approx(215)
    assert figures.coverage[0].coverage == pytest.approx(200 / 215) and figures.coverage[0].threshold == 0.9


async def test_few_outcomes_give_counts_and_no_figures_and_a_decisions_newest_outcome_counts() -> None:
    decision = stored(1, top=0.8)
    pairs = [(decision, labelled(decision, "billing", 2)), (decision, labelled(decision, "technical", 1))]
    other = stored(2, top=0.7)  # its label is no option of the task: left out, as tune leaves it
    unanswered = stored(3, top=0.6, answers={}, probabilities={})  # no distribution: nothing to score
    pairs += [(other, labelled(other, "weather")), (unanswered, labelled(unanswered, "billing"))]
    figures = await calibration_figures(FakeLog(pairs), SUPPORT, tenant="acme")
    assert (figures.labelled, figures.outcomes_read, figures.enough) == (1, 4, False)
    assert figures.ece is None and figures.reliability == [] and figures.coverage == []


async def test_a_checks_verdict_label_says_whether_its_rule_was_violated() -> None:
    def check(n: int, p: float, label: str) -> tuple[StoredDecision, StoredOutcome]:
        decision = stored(
            n,
            top=0.0,
            task="tool_safety",
            question="destructive_action",
            outcome="yes" if p >= 0.5 else "no",
            verdict="deny" if p >= 0.5 else "allow",
            answers={"yes": p, "no": 1 - p},
            probabilities={"yes": p, "no": 1 - p},
        )
        return decision, labelled(decision, label)

    pairs = [check(i, 0.9, "deny") for i in range(20)] + [check(50 + i, 0.2, "deny") for i in range(10)]
    figures = await calibration_figures(FakeLog(pairs), SAFETY, tenant="acme")
    # deny means the rule was violated: right where P(yes) was 0.9, wrong where System 1 said no at 0.8.
    assert figures.labelled == 30 and figures.accuracy == pytest.approx(20 / 30)


async def test_the_console_log_counts_from_the_rollups_and_bounds_its_reads(store: DecisionStore) -> None:
    since = datetime.now(UTC) - timedelta(hours=2)
    kinds = [{}, {}, {"system": 2, "escalate": True, "reason": "low_confidence"}, {"verdict": "review"}]
    for i, kind in enumerate(kinds):
        fields: dict[str, Any] = {
            "task": "support",
            "question": "support",
            "outcome": "billing",
            "system": 1,
            "reason": "confident",
            "confidence": 0.9,
            "threshold": 0.7,
            "probabilities": {"billing": 0.9, "other": 0.1},
            "policy_version": "v1",
            "engine": "embedded",
            "model": "e5",
            "latency_ms": 5.0,
        }
        decision = Decision(**{**fields, **kind})
        await store.record(decision, tenant="acme", state=f"text {i}")
        await store.record_outcome(decision.id, tenant="acme", label="billing")
    log = ConsoleLog(store, limit=3)
    assert await log.kept_counts(task="support", tenant="acme", since=since) == (4, 2)
    assert await log.kept_counts(task="support", tenant="acme", since=since) == await store.kept_counts(
        task="support", tenant="acme", since=since
    )
    first = await log.outcomes(tenant="acme", task="support")
    assert len(first) == 3 and await log.outcomes(tenant="acme", task="support") is first  # read once a view
    assert len(await log.decisions(task="support", tenant="acme")) == 3
    with pytest.raises(ValueError, match="one tenant"):
        await log.kept_counts(task="support")
    await log.aclose()
    assert await store.outcomes(tenant="acme")  # still open: the app's store is not the log's to close


def test_buckets_cover_the_range_in_aligned_steps_with_empty_ones_kept() -> None:
    since = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    summary = LogSummary(
        tenant="acme",
        task=None,
        since=since,
        until=since + timedelta(hours=24, minutes=5),
        hours=[HourFigures(since + timedelta(hours=1), 4, 3), HourFigures(since + timedelta(hours=2), 2, 0)],
    )
    three = buckets(summary, hours=3)
    assert three[0].start == since and three[0].hours == 3 and three[-1].start == since + timedelta(hours=24)
    assert [(b.decisions, b.kept) for b in three[:2]] == [(6, 3), (0, 0)]
    assert len(three) == 9 and three[0].kept_share == 0.5 and three[1].kept_share is None
    assert [b.start.hour for b in buckets(summary, hours=12)][:2] == [0, 12]  # whole days line up


def test_charts_draw_every_name_as_text() -> None:
    name = '<script>alert("x")</script>'
    chart = distribution({name: 0.75, "b&c": 0.25}, chosen=name, marks=[Mark(0.5, "<b>deny</b>")])
    reasons = escalations({name: 3})
    for svg in (str(chart), str(reasons)):
        assert "<script" not in svg and "&lt;script&gt;" in svg
    assert "<b>" not in str(chart) and "b&amp;c" in str(chart)
    assert 'class="bar chosen"' in str(chart)
