"""The console's figures as plain values: a task's calibration from recorded outcomes, the overview's series.

``calibration_figures`` is the one place the console (and the metrics that reuse it) turn recorded
outcomes into a reliability diagram and an accuracy-coverage curve. It reads them as
``fastslow tune --from-log`` does (``fastslow.policies.tuning.collect_from_log``): a decision's
newest outcome counts, ``logged_label`` says which option it makes right (a check's ``allow`` /
``deny`` included), ``sample_weight`` how much it weighs (the audit sample at ``1 / audit_rate``
when the task has one, with the escalations and reviews at 1; every outcome at 1 otherwise), and
``logged_prediction`` scores it as an evaluation would. It does not call ``collect_from_log``
itself, which reads the policy file and up to 100,000 outcomes and refuses a label the task does
not know: a page view reads the policy in force and the newest ``OUTCOME_LIMIT`` outcomes, and
leaves an odd label out.

The library's ``reliability`` and ``coverage_curve`` count rows unweighted; here each bin and each
point of the curve weighs its decisions (with unit weights they are the same figures), and the ECE
is the library's ``ece`` with the same weights. Below ``MIN_LABELLED`` labelled decisions nothing
is drawn: a few outcomes say nothing about calibration, and a page should say so rather than plot
noise.

``overview_page``, ``decision_page``, ``calibration_page`` and ``review_subject`` gather what each page
shows (its figures, charts and words) from those values, so the routes only read and render.

``ConsoleLog`` is the running app's decision log as ``fastslow.policies.tuning``'s readers take it
(``drift``, ``shadow_report``), bounded for a page view: the counts come from the hourly rollups,
never from a ``COUNT`` over the log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from fastslow.policies import describe_task
from fastslow.policies.evaluation import ece
from fastslow.policies.tuning import (
    LOG_LIMIT,
    MIN_KEPT_ROWS,
    SAMPLE_WORDS,
    OutcomeLog,
    Sample,
    drift,
    logged_label,
    logged_prediction,
    shadow_report,
)
from fastslow.policies.tuning import sample_weight as weight_of
from fastslow.router import CheckTask, ConfigError, PolicySet, Task

from . import _charts
from ._auth import when

if TYPE_CHECKING:
    from fastslow.api.app._services import Services
    from fastslow.api.store import DecisionStore, LogSummary, Review, StoredDecision, StoredOutcome

__all__ = [
    "BINS",
    "MIN_LABELLED",
    "OUTCOME_LIMIT",
    "Bucket",
    "CalibrationFigures",
    "ConsoleLog",
    "CoveragePoint",
    "ReliabilityBin",
    "buckets",
    "calibration_figures",
    "calibration_page",
    "decision_page",
    "overview_page",
    "review_subject",
]

OUTCOME_LIMIT = 5_000
"""The newest outcomes one view reads: enough for a stable diagram, bounded on a large log."""
MIN_LABELLED = MIN_KEPT_ROWS
"""Labelled decisions below which no figure is drawn (``fastslow report drift``'s least for a judgement)."""
BINS = 10
"""Equal-width confidence bins of the reliability diagram."""
CURVE_POINTS = 60
"""The most points of the accuracy-coverage curve kept (evenly spaced in coverage)."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ReliabilityBin:
    """One confidence bin: ``[lower, upper)``, its decisions, and their (weighted) mean confidence and accuracy."""

    lower: float
    upper: float
    rows: int
    weight: float
    confidence: float | None
    """``None`` for an empty bin."""
    accuracy: float | None


@dataclass(frozen=True, slots=True)
class CoveragePoint:
    """Keep the decisions at or above ``threshold``: the (weighted) share kept and their accuracy."""

    coverage: float
    accuracy: float
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFigures:
    """A task's calibration from the outcomes recorded in the decision log."""

    task: str
    labelled: int
    """Decisions whose newest outcome names a right option and that count under ``sample``."""
    outcomes_read: int
    """Outcomes read (at most the limit); fewer decisions are labelled when some say nothing usable."""
    truncated: bool
    """The read stopped at its limit: older outcomes were left out."""
    sample: Sample
    """``weighted`` (the audit sample at ``1 / audit_rate``) or ``all`` (every outcome at 1)."""
    min_labelled: int
    ece: float | None = None
    accuracy: float | None = None
    reliability: list[ReliabilityBin] = field(default_factory=list)
    coverage: list[CoveragePoint] = field(default_factory=list)

    @property
    def enough(self) -> bool:
        """Whether there are enough labelled decisions to draw anything."""
        return self.labelled >= self.min_labelled


async def calibration_figures(
    log: OutcomeLog,
    task: Task,
    *,
    tenant: str | None,
    since: datetime | None = None,
    limit: int = OUTCOME_LIMIT,
    bins: int = BINS,
    min_labelled: int = MIN_LABELLED,
) -> CalibrationFigures:
    """The reliability bins, accuracy-coverage curve and ECE of ``task``'s decisions with outcomes.

    Args:
        log: the decision log (a ``DecisionStore``); it is not closed.
        task: the task as the policy in force has it (its rules say what a check's label means).
        tenant: only this tenant's decisions; every tenant's when ``None``.
        since: only decisions made at or after this time.
        limit: the most outcomes read, newest first.
        bins: equal-width confidence bins.
        min_labelled: below this many labelled decisions only the counts come back.
    """
    pairs = await log.outcomes(tenant=tenant, task=task.name, since=since, limit=limit)
    sample: Sample = "weighted" if any(d.audit for d, _ in pairs) else "all"
    seen: set[str] = set()
    confidence: list[float] = []
    right: list[float] = []
    weights: list[float] = []
    for decision, outcome in pairs:
        if decision.id in seen:
            continue  # newest outcome first: a decision's later outcomes replace its earlier ones
        seen.add(decision.id)
        if not decision.probabilities:
            continue
        label = logged_label(task, decision.question, decision.outcome, decision.system, outcome)
        weight = weight_of(sample, decision)
        if label is None or weight is None or label not in decision.probabilities:
            continue
        scored = logged_prediction(decision, task, label=label, weight=weight)
        confidence.append(scored.confidence)
        right.append(float(scored.answer == label))
        weights.append(weight)
    figures = CalibrationFigures(
        task=task.name,
        labelled=len(confidence),
        outcomes_read=len(pairs),
        truncated=len(pairs) >= limit,
        sample=sample,
        min_labelled=min_labelled,
    )
    if not figures.enough or not confidence:
        return figures
    c, r, w = np.array(confidence), np.array(right), np.array(weights)
    return CalibrationFigures(
        task=figures.task,
        labelled=figures.labelled,
        outcomes_read=figures.outcomes_read,
        truncated=figures.truncated,
        sample=sample,
        min_labelled=min_labelled,
        ece=ece(c, r, bins=bins, weight=w),
        accuracy=float(np.average(r, weights=w)),
        reliability=_reliability(c, r, w, bins),
        coverage=_coverage(c, r, w),
    )


def _reliability(c: np.ndarray, r: np.ndarray, w: np.ndarray, bins: int) -> list[ReliabilityBin]:
    # The library's binning: bin b holds [b/bins, (b+1)/bins), the last one closed to hold 1.0.
    index = np.minimum((c * bins).astype(np.int64), bins - 1)
    rows = np.bincount(index, minlength=bins)
    total = np.bincount(index, weights=w, minlength=bins)
    conf = np.bincount(index, weights=w * c, minlength=bins)
    acc = np.bincount(index, weights=w * r, minlength=bins)
    out = []
    for b in range(bins):
        filled = total[b] > 0
        out.append(
            ReliabilityBin(
                lower=b / bins,
                upper=(b + 1) / bins,
                rows=int(rows[b]),
                weight=float(total[b]),
                confidence=float(conf[b] / total[b]) if filled else None,
                accuracy=float(acc[b] / total[b]) if filled else None,
            )
        )
    return out


def _coverage(c: np.ndarray, r: np.ndarray, w: np.ndarray) -> list[CoveragePoint]:
    # ``coverage_curve`` with weights: one point per distinct confidence, descending, ties entering together.
    order = np.argsort(-c, kind="stable")
    c_sorted = c[order]
    kept_w = np.cumsum(w[order])
    right_w = np.cumsum((w * r)[order])
    ends = np.flatnonzero(np.append(c_sorted[1:] != c_sorted[:-1], True))
    coverage = kept_w[ends] / kept_w[-1]
    accuracy = right_w[ends] / kept_w[ends]
    if len(ends) > CURVE_POINTS:  # evenly spaced in coverage, the first and last points kept
        grid = np.linspace(coverage[0], 1.0, CURVE_POINTS)
        keep = np.unique(np.minimum(np.searchsorted(coverage, grid), len(coverage) - 1))
        ends, coverage, accuracy = ends[keep], coverage[keep], accuracy[keep]
    return [
        CoveragePoint(coverage=float(k), accuracy=float(a), threshold=float(c_sorted[e]))
        for k, a, e in zip(coverage, accuracy, ends, strict=True)
    ]


class ConsoleLog:
    """The app's decision log as ``drift`` and ``shadow_report`` read it, bounded for one page view.

    Reads are capped at ``limit`` rows each (newest first), and a read asked for again is answered
    from the first (the calibration figures and the drift report read the same outcomes).
    ``kept_counts`` comes from the hourly rollups (whole hours; ``tenant`` required), and ``aclose``
    leaves the store open: the app's lifespan owns it.
    """

    def __init__(self, store: DecisionStore, *, limit: int = OUTCOME_LIMIT) -> None:
        self._store = store
        self._limit = limit
        self._read: dict[tuple[object, ...], list[tuple[StoredDecision, StoredOutcome]]] = {}

    async def outcomes(
        self,
        *,
        tenant: str | None = None,
        task: str | None = None,
        since: datetime | None = None,
        limit: int = LOG_LIMIT,
    ) -> list[tuple[StoredDecision, StoredOutcome]]:
        key = (tenant, task, since, min(limit, self._limit))
        if key not in self._read:
            self._read[key] = await self._store.outcomes(tenant=tenant, task=task, since=since, limit=key[3])
        return self._read[key]

    async def kept_counts(
        self, *, task: str, tenant: str | None = None, since: datetime | None = None
    ) -> tuple[int, int]:
        if tenant is None:
            raise ValueError("the console counts one tenant's decisions")
        summary = await self._store.summary(tenant=tenant, task=task, since=since or _EPOCH)
        return summary.decisions, summary.kept

    async def decisions(
        self,
        *,
        task: str,
        tenant: str | None = None,
        since: datetime | None = None,
        reason: str | None = None,
        limit: int = LOG_LIMIT,
    ) -> list[StoredDecision]:
        return await self._store.decisions(
            task=task, tenant=tenant, since=since, reason=reason, limit=min(limit, self._limit)
        )

    async def aclose(self) -> None:
        """Nothing to close: the store is the app's."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """A stretch of ``hours`` hours from ``start``: decisions made in it, and those System 1 kept."""

    start: datetime
    hours: int
    decisions: int
    kept: int

    @property
    def kept_share(self) -> float | None:
        return self.kept / self.decisions if self.decisions else None


def buckets(summary: LogSummary, *, hours: int) -> list[Bucket]:
    """The summary's hours in consecutive buckets of ``hours`` hours over its whole range, empty ones included."""
    # Aligned to whole buckets in UTC (3-hour buckets start at 00:00, 03:00, ...), so days line up.
    start = summary.since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    start -= timedelta(hours=start.hour % hours)
    count = max(1, -(-int((summary.until - start).total_seconds()) // (3600 * hours)))
    decided = [0] * count
    kept = [0] * count
    step = 3600 * hours
    for hour in summary.hours:
        i = int((hour.hour - start).total_seconds()) // step
        if 0 <= i < count:
            decided[i] += hour.decisions
            kept[i] += hour.kept
    return [Bucket(start + timedelta(hours=i * hours), hours, decided[i], kept[i]) for i in range(count)]


# -- what each page shows --------------------------------------------------------------------------------


def overview_page(summary: LogSummary, in_force: str, *, hours: int) -> dict[str, Any]:
    """The overview's charts and words over ``summary``, in columns of ``hours`` hours."""
    series = buckets(summary, hours=hours)
    rate, share = _charts.activity(
        [b.start for b in series],
        [b.decisions for b in series],
        [b.kept for b in series],
        hours=hours,
        now=summary.until,
    )
    seen = next((v for v in summary.policy_versions if v.version == in_force), None)
    if seen is None:
        changed = "no decisions under it in this range"
    elif seen.first_hour <= summary.since:
        changed = "in force over the whole range"
    else:
        changed = f"first decisions under it {when(seen.first_hour)}"
    return {
        "summary": summary,
        "rate": rate,
        "share": share,
        "escalations": _charts.escalations(summary.escalations) if summary.escalations else None,
        "in_force": in_force,
        "changed": changed,
    }


def decision_page(d: StoredDecision, policy: PolicySet) -> dict[str, Any]:
    """The decision page's figures: its chart with the thresholds it was held against, its state, its form."""
    task = policy.tasks.get(d.task)
    same = d.policy_version == policy.version
    held: list[tuple[str, str]] = [("recorded threshold", f"{d.threshold:.3f}")]
    marks: list[_charts.Mark] = []
    labels: list[tuple[str, str]] = []
    if isinstance(task, CheckTask) and d.question in task.rules:
        action = task.rules[d.question].action
        held += [("violation option", action.violation), ("allow at or below", f"{action.allow_at:.3f}")]
        held.append(("deny at or above", f"{action.deny_at:.3f}"))
        marks = [_charts.Mark(action.allow_at, f"allow {action.allow_at:g}", "allow")]
        marks.append(_charts.Mark(action.deny_at, f"deny {action.deny_at:g}", "deny"))
    elif task is not None and not isinstance(task, CheckTask):
        held += [("min confidence", f"{task.thresholds.min_confidence:.3f}")]
        held.append(("min margin", f"{task.thresholds.min_margin:.3f}"))
        marks = [_charts.Mark(task.thresholds.min_confidence, f"min confidence {task.thresholds.min_confidence:g}")]
    if d.verdict is not None:
        labels = [("deny", "deny: the rule was violated"), ("allow", "allow: the rule was not violated")]
    else:
        labels = [(o, o) for o in sorted(set(d.answers) | ({d.outcome} if d.outcome else set()))]
    chosen = d.outcome
    if isinstance(task, CheckTask) and d.question in task.rules:
        chosen = task.rules[d.question].action.violation
    state: str | None = None
    if d.state_text is not None:
        try:
            parsed = json.loads(d.state_text)
            state = parsed if isinstance(parsed, str) else json.dumps(parsed, indent=2, ensure_ascii=False)
        except ValueError:
            state = d.state_text
    return {
        "d": d,
        "chart": _charts.distribution(d.answers, chosen=chosen, marks=marks) if d.answers else None,
        "held": held,
        "same_policy": same,
        "known_task": task is not None,
        "in_force": policy.version,
        "state": state,
        "labels": labels,
    }


async def calibration_page(services: Services, task: Task | None, *, tenant: str, since: datetime) -> dict[str, Any]:
    """The calibration page of ``task`` (the policy in force's): its figures, drift, fitted records, shadow report."""
    if task is None:
        return {"task": None}
    log = ConsoleLog(services.decisions)
    figures = await calibration_figures(log, task, tenant=tenant, since=since)
    out: dict[str, Any] = {
        "task": task,
        "figures": figures,
        "sample_words": SAMPLE_WORDS[figures.sample],
        "fitted": describe_task(task, default_engine=services.settings.engine)["fitted"],
        "drift": None,
        "shadow": None,
    }
    if figures.enough:
        bins = [(b.lower, b.upper, b.rows, b.confidence, b.accuracy) for b in figures.reliability]
        out["reliability"] = _charts.reliability(bins)
        out["coverage"] = _charts.coverage([(p.coverage, p.accuracy, p.threshold) for p in figures.coverage])
    path = services.runtime.store.path

    async def opened() -> ConsoleLog:
        return log

    if "thresholds" in task.fitted or "calibration" in task.fitted:
        try:
            found = await drift(
                opened, settings=services.settings, policy=path, task=task.name, tenant=tenant, since=since
            )
            out["drift"] = {"refit": found.refit, "lines": found.lines}
        except ConfigError as exc:
            out["drift"] = {"refit": False, "lines": [f"drift cannot be judged: {exc}"]}
    if task.mode == "shadow":
        try:
            shadow = await shadow_report(
                opened, settings=services.settings, policy=path, task=task.name, tenant=tenant, since=since
            )
            out["shadow"] = shadow.lines
        except ConfigError as exc:
            out["shadow"] = [f"the shadow report cannot be made: {exc}"]
    return out


def review_subject(review: Review) -> dict[str, Any]:
    """What was checked, as text for the page: a text, or a tool call's name and arguments as JSON."""
    call = review.subject.get("tool_call")
    if isinstance(call, Mapping):
        args = json.dumps(call.get("args", call.get("arguments", {})), indent=2, ensure_ascii=False, default=str)
        return {"kind": "tool_call", "name": str(call.get("name", "")), "args": args}
    text = review.subject.get("text")
    return {"kind": "text", "text": text if isinstance(text, str) else json.dumps(dict(review.subject), default=str)}
