"""``fastslow report drift``: do the decisions logged lately still match what the task's fit promised?

The ``fitted:`` records of ``fastslow tune`` and ``calibrate`` state what held on held-out data:
the accuracy target of the decisions System 1 keeps, the share it keeps, and the calibration
error. This compares them with the decision log since ``--since``:

* **accuracy of kept decisions**, from their recorded outcomes (the audit sample, weighted as
  ``tune --from-log`` weighs it, when the task has one): drift when even its upper confidence bound
  is below the target;
* **coverage**, from every logged decision, labelled or not: drift when it moved more than
  ``COVERAGE_SHIFT`` from the fit's held-out share (the traffic changed);
* **calibration**, the ECE of the labelled decisions: drift when it exceeds ``max(ECE_FLOOR,
  2 x the fit's)``, with at least ``MIN_ECE_ROWS`` of them.

Each needs enough labelled decisions to say anything; with too few the report says so and counts
no drift, so a quiet service does not page anyone. Refit (exit status 1) when any figure drifted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.policies.evaluation import ece
from fastslow.router import ConfigError, Settings

from ._bounds import wilson_lower, wilson_upper
from ._collect import load_task
from ._log import LOG_LIMIT, DriftLog, Sample, kept_by_system1, logged_label, logged_prediction, sample_weight

__all__ = ["COVERAGE_SHIFT", "ECE_FLOOR", "MIN_ECE_ROWS", "MIN_KEPT_ROWS", "Drift", "drift"]

COVERAGE_SHIFT = 0.10
ECE_FLOOR = 0.05
MIN_KEPT_ROWS = 30
MIN_ECE_ROWS = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """What ``drift`` found: whether to refit, lines for people, and the figures behind them."""

    task: str
    refit: bool
    lines: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


async def drift(
    open_log: Callable[[], Awaitable[DriftLog]],
    *,
    settings: Settings,
    policy: Path,
    task: str,
    tenant: str | None = None,
    since: datetime | None = None,
    level: float = 0.95,
) -> Drift:
    """Compare the decisions logged since ``since`` with the task's ``fitted:`` records (module docstring).

    Args:
        open_log: opens the decision log (``DecisionStore.open`` with its URL), once the task is
            known to have something fitted; it is closed before the figures are computed.
        settings: the default engine the policy is loaded with.
        policy: the policy file holding the task and its fitted records.
        task: the task to judge.
        tenant: only this tenant's decisions; every tenant's when ``None``.
        since: only decisions made at or after this time.
        level: the confidence level of the accuracy bounds.

    Returns:
        ``refit`` when any figure drifted, with a line per figure.

    Raises:
        ConfigError: an unknown task, or a task with nothing fitted to compare with.
    """
    policy_set = load_task(policy, task, settings)
    the_task = policy_set.tasks[task]
    thresholds, calibration = the_task.fitted.get("thresholds"), the_task.fitted.get("calibration")
    if thresholds is None and calibration is None:
        raise ConfigError(
            f"task {task!r} has no fitted: record to compare with; run fastslow tune or calibrate first",
            path=str(policy),
            key=f"tasks.{task}.fitted",
        )
    store = await open_log()
    try:
        pairs = await store.outcomes(tenant=tenant, task=task, since=since, limit=LOG_LIMIT)
        total, kept_n = await store.kept_counts(task=task, tenant=tenant, since=since)
    finally:
        await store.aclose()
    sample: Sample = "weighted" if any(d.audit for d, _ in pairs) else "all"
    seen: set[str] = set()
    conf: list[float] = []
    right: list[float] = []
    weights: list[float] = []
    kept_flags: list[bool] = []
    for decision, outcome in pairs:
        if decision.id in seen or not decision.probabilities:
            continue
        seen.add(decision.id)
        label = logged_label(the_task, decision.question, decision.outcome, decision.system, outcome)
        weight = sample_weight(sample, decision)
        if label is None or weight is None:
            continue
        scored = logged_prediction(decision, the_task, label=label, weight=weight)
        conf.append(scored.confidence)
        right.append(float(scored.answer == label))
        weights.append(weight)
        kept_flags.append(kept_by_system1(decision))
    refit = False
    lines = [f"task {task}: {total} decisions logged{_since(since)}, {len(conf)} labelled ({sample} sample)"]
    figures: dict[str, Any] = {"decisions": total, "labelled": len(conf), "sample": sample}
    if thresholds is not None:
        expected_kept = float(thresholds.get("held_out", {}).get("kept", float("nan")))
        coverage = kept_n / total if total else float("nan")
        figures["coverage"] = {"now": coverage, "fitted": expected_kept}
        if total >= MIN_KEPT_ROWS and abs(coverage - expected_kept) > COVERAGE_SHIFT:
            refit = True
            lines.append(
                f"DRIFT coverage: System 1 keeps {coverage:.1%}, the fit kept {expected_kept:.1%} held out: "
                "the traffic changed"
            )
        else:
            lines.append(f"coverage {coverage:.1%} (fitted {expected_kept:.1%})")
        target = float(thresholds.get("target_accuracy", float("nan")))
        w = np.array(weights)
        k = np.array(kept_flags, dtype=bool)
        r = np.array(right)
        n_kept = int(k.sum())
        if n_kept < MIN_KEPT_ROWS:
            lines.append(
                f"accuracy of kept decisions: {n_kept} labelled, too few to judge (at least {MIN_KEPT_ROWS}: "
                "record outcomes, or set audit_rate for an audit sample)"
            )
        else:
            wk = w[k]
            accuracy = float(np.average(r[k], weights=wk))
            n_eff = float(wk.sum() ** 2 / (wk * wk).sum())
            low = wilson_lower(accuracy * n_eff, n_eff, level)
            high = wilson_upper(accuracy * n_eff, n_eff, level)
            figures["kept_accuracy"] = {"now": accuracy, "low": low, "high": high, "target": target}
            if high < target:
                refit = True
                lines.append(
                    f"DRIFT accuracy of kept decisions: {accuracy:.1%} ({level:.0%} bounds {low:.1%}-{high:.1%}, "
                    f"{n_kept} decisions) is below the {target:.1%} the thresholds were tuned to"
                )
            else:
                lines.append(f"accuracy of kept decisions {accuracy:.1%} ({low:.1%}-{high:.1%}; target {target:.1%})")
    if calibration is not None:
        fitted_ece = float(calibration.get("held_out", {}).get("after", {}).get("ece", ECE_FLOOR))
        limit = max(ECE_FLOOR, 2 * fitted_ece)
        if len(conf) < MIN_ECE_ROWS:
            lines.append(f"calibration: {len(conf)} labelled decisions, too few to judge (at least {MIN_ECE_ROWS})")
        else:
            now = ece(np.array(conf), np.array(right), weight=np.array(weights))
            figures["ece"] = {"now": now, "fitted": fitted_ece, "limit": limit}
            if now > limit:
                refit = True
                lines.append(f"DRIFT calibration: ECE {now:.3f} against {fitted_ece:.3f} fitted (limit {limit:.3f})")
            else:
                lines.append(f"calibration ECE {now:.3f} (fitted {fitted_ece:.3f})")
    lines.append(
        "refit: run fastslow calibrate / tune --from-log (exit status 1)" if refit else "no drift (exit status 0)"
    )
    return Drift(task=task, refit=refit, lines=lines, figures=figures)


def _since(since: datetime | None) -> str:
    return "" if since is None else f" since {since.isoformat(timespec='seconds')}"
