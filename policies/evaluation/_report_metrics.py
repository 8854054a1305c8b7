"""``metrics.json`` of an evaluation run: every figure, by question and overall, from its predictions.

The figures come from ``_metrics``; this module only chooses the rows and arrays each one is
computed over (``_scoring`` says which predictions count how). Every key is documented in
docs/evaluation.md ("The report"). "Overall" pools every scored (row, question) pair of the run: a
row with three labelled questions counts three times. Latency is per row, whatever its questions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._metrics import (
    Confusion,
    CoverageCurve,
    accuracy,
    apgr,
    auroc,
    brier,
    confusion,
    coverage_at,
    coverage_curve,
    cpt,
    ece,
    log_loss,
    macro_f1,
    percentiles,
    verdict_shares,
)
from ._predictions import Prediction, RunInfo
from ._scoring import (
    F64,
    Json,
    answers_of,
    by_question,
    has_distribution,
    is_correct,
    is_kept,
    labels_of,
    latency_per_row,
    probability,
    unit,
    weights,
)

__all__ = [
    "CONFUSION_FILE",
    "COVERAGE_PLOT",
    "CURVE_POINTS",
    "ECE_BINS",
    "GROUP_KEYS",
    "METRICS_FILE",
    "METRICS_KEYS",
    "RELIABILITY_PLOT",
    "REPORT_FORMAT",
    "SUMMARY_FILE",
    "TARGETS",
    "clean",
    "compute_metrics",
    "curve_inputs",
    "question_confusion",
]

METRICS_FILE = "metrics.json"
CONFUSION_FILE = "confusion.json"
SUMMARY_FILE = "summary.md"
RELIABILITY_PLOT = "reliability.png"
COVERAGE_PLOT = "coverage.png"
REPORT_FORMAT = "fastslow-eval-report/1"
"""``metrics.json``'s ``format``: changes whenever a documented key changes meaning or goes."""

METRICS_KEYS = ("counts", "files", "format", "overall", "questions", "run")
"""The top-level keys of ``metrics.json``."""
GROUP_KEYS = (
    "accuracy",
    "calibration",
    "coverage",
    "escalation",
    "kept",
    "kind",
    "latency_ms",
    "macro_f1",
    "n",
    "out_of_scope",
    "predictions",
    "routellm",
    "unanswered",
    "verdicts",
    "worst_confusions",
)
"""The keys of ``overall`` and of each entry of ``questions``."""

TARGETS = (0.95, 0.97, 0.99)
ECE_BINS = 15
CURVE_POINTS = 200
WORST = 10
THRESHOLDS_LISTED = 20
_DIGITS = 6


# -- sections of a group ------------------------------------------------------------------------------


def _labels(scored: Sequence[Prediction], pooled: bool) -> Json:
    truth, answer = labels_of(scored), answers_of(scored)
    answered = [p for p in scored if p.answer is not None]

    def name(p: Prediction, option: str | None) -> str:
        # Pooled over questions, each class is (question, option): two rules' "yes" are two classes.
        return f"{p.question}\x1f{option}" if pooled else str(option)

    # An unanswered prediction has no predicted class: a pseudo-class for it would join the
    # average with an F1 of 0, so macro-F1 is over the answered ones (accuracy counts the rest).
    f1 = macro_f1([name(p, p.label) for p in answered], [name(p, p.answer) for p in answered]) if answered else math.nan
    return {"accuracy": accuracy(truth, answer, weights(scored)), "macro_f1": f1}


def _calibration(scored: Sequence[Prediction]) -> Json:
    rows = [p for p in scored if has_distribution(p)]
    body: Json = {"rows": len(rows), "without_distribution": len(scored) - len(rows), "bins": ECE_BINS}
    if not rows:
        return body | {"ece": math.nan, "brier": math.nan, "log_loss": math.nan}
    w = weights(rows)
    # Columns are each row's own options; padding with zeros leaves Brier and log loss unchanged,
    # so questions with different option lists pool into one matrix.
    width = max(len(p.options) for p in rows)
    probs = np.zeros((len(rows), width))
    for i, p in enumerate(rows):
        probs[i, : len(p.options)] = [probability(p, o) for o in p.options]
    probs = np.clip(probs, 0.0, 1.0)
    truth = np.array([p.options.index(p.label or "") for p in rows], dtype=np.int64)
    correct = np.array([is_correct(p) for p in rows], dtype=np.float64)
    confidence = unit(p.confidence for p in rows)
    return body | {
        "ece": ece(confidence, correct, bins=ECE_BINS, weight=w),
        "brier": brier(probs, truth, weight=w),
        "log_loss": log_loss(probs, truth, weight=w),
    }


def _share(mask: NDArray[np.bool_], w: F64 | None) -> float:
    return float(np.average(mask, weights=w))


def _kept(scored: Sequence[Prediction]) -> Json:
    kept = np.array([is_kept(p) for p in scored], dtype=bool)
    w = weights(scored)
    chosen = [p for p, k in zip(scored, kept, strict=True) if k]
    kept_accuracy = accuracy(labels_of(chosen), answers_of(chosen), weights(chosen)) if chosen else math.nan
    thresholds = sorted({p.threshold for p in scored})
    return {
        "share": _share(kept, w),
        "accuracy": kept_accuracy,
        "rows": len(chosen),
        "thresholds": thresholds[:THRESHOLDS_LISTED],
        "distinct_thresholds": len(thresholds),
    }


def _escalation(scored: Sequence[Prediction]) -> Json:
    w = weights(scored)
    escalated = np.array([not is_kept(p) for p in scored], dtype=bool)
    reasons = np.array([p.reason for p in scored], dtype=object)
    by_reason: Json = {}
    for reason in sorted({p.reason for p, e in zip(scored, escalated, strict=True) if e}):
        mask = escalated & (reasons == reason)
        by_reason[reason] = {"rows": int(mask.sum()), "share": _share(mask, w)}
    return {"share": _share(escalated, w), "rows": int(escalated.sum()), "by_reason": by_reason}


def _thin(curve: CoverageCurve, points: int = CURVE_POINTS) -> CoverageCurve:
    """At most ``points`` points evenly spaced in coverage, the first and the last always kept."""
    if len(curve.coverage) <= points:
        return curve
    grid = np.linspace(curve.coverage[0], 1.0, points)
    index = np.unique(np.minimum(np.searchsorted(curve.coverage, grid), len(curve.coverage) - 1))
    return CoverageCurve(curve.coverage[index], curve.accuracy[index], curve.threshold[index])


def curve_inputs(scored: Sequence[Prediction]) -> tuple[F64, F64]:
    confidence = unit(p.confidence if p.answer is not None else 0.0 for p in scored)
    correct = np.array([is_correct(p) for p in scored], dtype=np.float64)
    return confidence, correct


def _coverage(scored: Sequence[Prediction]) -> Json:
    confidence, correct = curve_inputs(scored)
    curve = _thin(coverage_curve(confidence, correct))
    at: Json = {}
    for target in TARGETS:
        point = coverage_at(confidence, correct, target)
        at[f"{target:.2f}"] = {"coverage": point.coverage, "accuracy": point.accuracy, "threshold": point.threshold}
    return {
        "descriptive": True,
        "rows": len(scored),
        "curve": {
            "coverage": curve.coverage.tolist(),
            "accuracy": curve.accuracy.tolist(),
            "threshold": curve.threshold.tolist(),
        },
        "at": at,
    }


def _latency(predictions: Sequence[Prediction]) -> Json:
    values = latency_per_row(predictions)
    if values.size == 0:
        return {"rows": 0, "p50": math.nan, "p99": math.nan}
    q = percentiles(values, (50, 99))
    return {"rows": int(values.size), "p50": q[50.0], "p99": q[99.0]}


def _out_of_scope(scored: Sequence[Prediction]) -> Json | None:
    candidates = [p for p in scored if p.none_option is not None]
    if not candidates:
        return None
    rows = [p for p in candidates if has_distribution(p)]
    body: Json = {
        "none_options": sorted({p.none_option for p in candidates if p.none_option is not None}),
        "rows": len(rows),
        "without_distribution": len(candidates) - len(rows),
        "positives": sum(p.label == p.none_option for p in rows),
        "auroc_p_none": math.nan,
        "auroc_not_max_in_scope": math.nan,
    }
    if rows:
        positive = np.array([p.label == p.none_option for p in rows], dtype=bool)
        p_none = unit(probability(p, p.none_option or "") for p in rows)
        max_in_scope = unit(
            max((probability(p, o) for o in p.options if o != p.none_option), default=0.0) for p in rows
        )
        body["auroc_p_none"] = auroc(p_none, positive)
        body["auroc_not_max_in_scope"] = auroc(1.0 - max_in_scope, positive)
    return body


def _shares(classes: Sequence[str], verdicts: Sequence[str]) -> Json:
    return {
        str(label): {"allowed": s.allowed, "reviewed": s.reviewed, "denied": s.denied, "rows": s.rows}
        for label, s in verdict_shares(classes, verdicts).items()
    }


def _verdicts(scored: Sequence[Prediction], pooled: bool) -> Json | None:
    rows = [p for p in scored if p.verdict is not None]
    if not rows:
        return None
    ruled = [p for p in rows if p.violation is not None]
    return {
        "rows": len(rows),
        # Pooled over rules, a label's name ("yes") means something different in each rule.
        "by_label": None if pooled else _shares([p.label or "" for p in rows], [p.verdict or "" for p in rows]),
        "by_violation": (
            _shares(
                ["violation" if p.label == p.violation else "ok" for p in ruled],
                [p.verdict or "" for p in ruled],
            )
            if ruled
            else None
        ),
    }


def _outcome(value: Any) -> float | None:
    if isinstance(value, bool | int | float) and 0.0 <= float(value) <= 1.0:
        return float(value)
    return None


def _routing_figures(score: F64, weak: F64, strong: F64, quantiles: int | None) -> Json:
    try:
        return {
            "apgr": apgr(score, weak, strong, quantiles=quantiles),
            "cpt_50": cpt(score, weak, strong, 0.5, quantiles=quantiles),
            "cpt_80": cpt(score, weak, strong, 0.8, quantiles=quantiles),
        }
    except ValueError:  # the two models score the same on average: no gap to recover
        return {"apgr": math.nan, "cpt_50": math.nan, "cpt_80": math.nan}


def _routellm(predictions: Sequence[Prediction]) -> Json | None:
    """APGR and CPT when the rows carry both models' outcomes; the score is P(no) of a yes/no question.

    The RouteLLM converters ask "will the weak model answer correctly?", so the probability of
    "no" is the probability that the prompt needs the strong model: RouteLLM's router score.
    """
    candidates = [p for p in predictions if "weak_correct" in p.meta and "strong_correct" in p.meta]
    if not candidates:
        return None
    usable: list[tuple[float, float, float]] = []
    for p in candidates:
        weak, strong = _outcome(p.meta["weak_correct"]), _outcome(p.meta["strong_correct"])
        if p.kind == "noul" and "no" in p.options and p.probabilities and weak is not None and strong is not None:
            usable.append((min(max(probability(p, "no"), 0.0), 1.0), weak, strong))
    body: Json = {"score": "P(no)", "rows": len(usable), "skipped": len(candidates) - len(usable)}
    if not usable:
        return body | dict.fromkeys(("weak_accuracy", "strong_accuracy", "every_threshold", "quantiles_10"))
    score, weak_correct, strong_correct = (np.array(column) for column in zip(*usable, strict=True))
    return body | {
        "weak_accuracy": float(weak_correct.mean()),
        "strong_accuracy": float(strong_correct.mean()),
        "every_threshold": _routing_figures(score, weak_correct, strong_correct, None),
        "quantiles_10": _routing_figures(score, weak_correct, strong_correct, 10),
    }


def question_confusion(scored: Sequence[Prediction]) -> Confusion:
    """Confusion counts of one question's scored predictions, in the order of its options."""
    options: dict[str, None] = {}
    for p in scored:
        options.update(dict.fromkeys(p.options))
    truth, answer = labels_of(scored), answers_of(scored)
    extra = sorted(set(truth + answer) - set(options))  # an unanswered column, or an engine's stray answer
    return confusion(truth, answer, labels=[*options, *extra], worst=WORST)


def _worst(question: str, matrix: Confusion) -> list[Json]:
    return [{"question": question, "true": t, "predicted": p, "count": c} for t, p, c in matrix.worst]


def _group(predictions: Sequence[Prediction], confusions: Mapping[str, Confusion], *, pooled: bool) -> Json:
    scored = [p for p in predictions if p.label is not None]
    kinds = sorted({p.kind for p in predictions})
    # Most frequent first; ties by question, then in the question's own order (its options').
    ranked = [(question, i, item) for question, m in confusions.items() for i, item in enumerate(_worst(question, m))]
    ranked.sort(key=lambda entry: (-entry[2]["count"], entry[0], entry[1]))
    worst = [item for _, _, item in ranked[:WORST]]
    body: Json = {
        "kind": kinds[0] if len(kinds) == 1 else "mixed",
        "predictions": len(predictions),
        "n": len(scored),
        "unanswered": sum(p.answer is None for p in scored),
        "latency_ms": _latency(predictions),
        "worst_confusions": worst,
    }
    if not scored:
        return body | dict.fromkeys(set(GROUP_KEYS) - set(body))
    return body | {
        **_labels(scored, pooled),
        "calibration": _calibration(scored),
        "kept": _kept(scored),
        "escalation": _escalation(scored),
        "coverage": _coverage(scored),
        "out_of_scope": _out_of_scope(scored),
        "verdicts": _verdicts(scored, pooled),
        "routellm": _routellm(predictions),
    }


# -- metrics.json ----------------------------------------------------------------------------------------


def _run_section(run: RunInfo) -> Json:
    return {
        "data": run.data,
        "data_sha256": run.data_sha256,
        "engine": run.engine,
        "model": run.model,
        "policy": run.policy,
        "policy_version": run.policy_version,
        "task": run.task,
        "split": run.split,
        "rows": run.rows,
        "examples": dict(run.examples),
        "dropped_training_rows": len(run.dropped_training_rows),
        "problems": len(run.problems),
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "complete": run.finished_at is not None,
        "settings": dict(run.settings),
    }


def clean(value: Any) -> Any:
    """JSON-ready: floats rounded to 6 decimals, NaN and infinities as ``None``, tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return round(number, _DIGITS) if math.isfinite(number) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [clean(v) for v in value]
    raise TypeError(f"not JSON-ready: {type(value).__name__}")


def compute_metrics(
    run: RunInfo, predictions: Sequence[Prediction], duplicates: int = 0
) -> tuple[Json, dict[str, Confusion]]:
    """``metrics.json`` as a dict (before ``clean``), and the confusion counts of each labelled question."""
    groups = by_question(predictions)
    confusions = {
        name: question_confusion(scored)
        for name, group in groups.items()
        if (scored := [p for p in group if p.label is not None])
    }
    questions = {
        name: _group(group, {name: confusions[name]} if name in confusions else {}, pooled=False)
        for name, group in groups.items()
    }
    overall = _group(predictions, confusions, pooled=True)
    # Several questions' outcomes pooled would count each row once per question: overall has
    # RouteLLM figures only when one question carries them.
    routed = [body["routellm"] for body in questions.values() if body["routellm"] is not None]
    overall["routellm"] = routed[0] if len(routed) == 1 else None
    scored = sum(body["n"] for body in questions.values())
    metrics = {
        "format": REPORT_FORMAT,
        "run": _run_section(run),
        "counts": {
            "predictions": len(predictions),
            "rows": len({p.row for p in predictions}),
            "questions": len(groups),
            "scored": scored,
            "unlabelled": len(predictions) - scored,
            "duplicates": duplicates,
            "weighted": weights(predictions) is not None,
        },
        "overall": overall,
        "questions": questions,
        "files": [],
    }
    return metrics, confusions
