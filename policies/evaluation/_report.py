"""The report of an evaluation run: ``metrics.json``, ``confusion.json``, two plots and ``summary.md``.

Everything is computed from the directory's ``run.json`` and ``predictions.jsonl`` (see
``_predictions``), so a report is rebuilt, or two runs compared, without an engine. The figures
come from ``_metrics``; this module only chooses the rows and arrays each one is computed over.
Every key of ``metrics.json`` is documented in docs/evaluation.md ("The report").

Rows, as the metrics see them:

- A prediction is *scored* when it has a label. Scored predictions are what every figure but
  latency is computed over; unlabelled ones are counted, nothing more.
- A scored prediction without an answer (an engine error) is wrong for accuracy and not kept.
- Calibration (ECE, Brier, log loss) needs System 1's distribution: predictions without one are
  left out of it and counted.
- "Overall" pools every scored (row, question) pair of the run: a row with three labelled
  questions counts three times. Latency is per row, whatever its questions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from fastslow.router import ConfigError

from ._metrics import (
    Confusion,
    CoverageCurve,
    Reliability,
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
    reliability,
    verdict_shares,
)
from ._plots import CoverageSeries, plot_coverage, plot_reliability, plotting_available
from ._predictions import PREDICTIONS_FILE, RUN_FILE, Prediction, RunInfo, read_predictions, read_run

__all__ = [
    "CONFUSION_FILE",
    "COVERAGE_PLOT",
    "GROUP_KEYS",
    "METRICS_FILE",
    "METRICS_KEYS",
    "RELIABILITY_PLOT",
    "REPORT_FORMAT",
    "SUMMARY_FILE",
    "Report",
    "write_report",
]

F64: TypeAlias = NDArray[np.float64]
Json: TypeAlias = dict[str, Any]

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
PLOT_QUESTIONS = 6
THRESHOLDS_LISTED = 20
NO_ANSWER = "(no answer)"
"""The predicted class of an unanswered prediction in the confusion counts."""
_DIGITS = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What ``write_report`` wrote: the metrics (as in ``metrics.json``) and the files' names."""

    directory: Path
    run: RunInfo
    metrics: Mapping[str, Any]
    files: tuple[str, ...]
    """The report's files in ``directory``, ``predictions.jsonl`` and ``run.json`` included."""
    notes: tuple[str, ...] = ()
    """What could not be produced and why (also in ``summary.md``)."""


# -- rows --------------------------------------------------------------------------------------------


def is_correct(prediction: Prediction) -> bool:
    """Right answer; an unanswered or unlabelled prediction is not correct."""
    return prediction.answer is not None and prediction.answer == prediction.label


def is_kept(prediction: Prediction) -> bool:
    """Kept by the run's thresholds; an unanswered prediction never is, whatever the runner wrote."""
    return prediction.kept and prediction.answer is not None


def has_distribution(prediction: Prediction) -> bool:
    """Whether calibration can use it: an answer, a distribution and a label among the options."""
    return bool(prediction.probabilities) and prediction.answer is not None and prediction.label in prediction.options


def weights(predictions: Sequence[Prediction]) -> F64 | None:
    """Per-prediction weights, or ``None`` when all are 1 or none is positive (then unweighted)."""
    w = np.array([p.weight for p in predictions], dtype=np.float64)
    if w.size == 0 or (w == 1.0).all() or w.sum() <= 0:
        return None
    return w


def _unit(values: Iterable[float]) -> F64:
    # Engines' distributions may overshoot [0, 1] by rounding; the metrics reject that outright.
    return np.clip(np.fromiter(values, dtype=np.float64), 0.0, 1.0)


def _truth(scored: Sequence[Prediction]) -> list[str]:
    return [p.label or "" for p in scored]  # scored: every label is set


def _answers(predictions: Sequence[Prediction]) -> list[str]:
    return [p.answer if p.answer is not None else NO_ANSWER for p in predictions]


def _probability(prediction: Prediction, option: str) -> float:
    return float(prediction.probabilities.get(option, 0.0))


def latency_per_row(predictions: Sequence[Prediction]) -> F64:
    """One latency per distinct row: a row's questions share one engine call and its latency."""
    first: dict[str, float] = {}
    for p in predictions:
        first.setdefault(p.row, p.latency_ms)
    return np.fromiter(first.values(), dtype=np.float64)


def dedupe(predictions: Iterable[Prediction]) -> tuple[list[Prediction], int]:
    """One prediction per (row, question), the last written winning, and how many were replaced.

    A resumed run redoes a row whose line was cut short; should it ever write a pair twice, the
    later answer is the one that counts and the pair counts once.
    """
    latest: dict[tuple[str, str], Prediction] = {}
    total = 0
    for p in predictions:
        latest[(p.row, p.question)] = p
        total += 1
    return list(latest.values()), total - len(latest)


def by_question(predictions: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    """Predictions grouped by question, questions in name order."""
    groups: dict[str, list[Prediction]] = {}
    for p in predictions:
        groups.setdefault(p.question, []).append(p)
    return dict(sorted(groups.items()))


# -- sections of a group ------------------------------------------------------------------------------


def _labels(scored: Sequence[Prediction], pooled: bool) -> Json:
    truth, answer = _truth(scored), _answers(scored)
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
        probs[i, : len(p.options)] = [_probability(p, o) for o in p.options]
    probs = np.clip(probs, 0.0, 1.0)
    truth = np.array([p.options.index(p.label or "") for p in rows], dtype=np.int64)
    correct = np.array([is_correct(p) for p in rows], dtype=np.float64)
    confidence = _unit(p.confidence for p in rows)
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
    kept_accuracy = accuracy(_truth(chosen), _answers(chosen), weights(chosen)) if chosen else math.nan
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


def _curve_inputs(scored: Sequence[Prediction]) -> tuple[F64, F64]:
    confidence = _unit(p.confidence if p.answer is not None else 0.0 for p in scored)
    correct = np.array([is_correct(p) for p in scored], dtype=np.float64)
    return confidence, correct


def _coverage(scored: Sequence[Prediction]) -> Json:
    confidence, correct = _curve_inputs(scored)
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
        p_none = _unit(_probability(p, p.none_option or "") for p in rows)
        max_in_scope = _unit(
            max((_probability(p, o) for o in p.options if o != p.none_option), default=0.0) for p in rows
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
            usable.append((min(max(_probability(p, "no"), 0.0), 1.0), weak, strong))
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
    truth, answer = _truth(scored), _answers(scored)
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


def _confusion_json(confusions: Mapping[str, Confusion]) -> Json:
    return {
        name: {
            "labels": [str(label) for label in matrix.labels],
            "counts": matrix.counts.tolist(),
            "worst": [{"true": t, "predicted": p, "count": c} for t, p, c in matrix.worst],
        }
        for name, matrix in confusions.items()
    }


# -- plots -------------------------------------------------------------------------------------------------


def _plotted(predictions: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    """Up to ``PLOT_QUESTIONS`` questions drawn one line each; more than that, one overall line."""
    groups = {name: [p for p in group if p.label is not None] for name, group in by_question(predictions).items()}
    groups = {name: group for name, group in groups.items() if group}
    if 0 < len(groups) <= PLOT_QUESTIONS:
        return groups
    return {"overall": [p for p in predictions if p.label is not None]}


def _plots(directory: Path, predictions: Sequence[Prediction], metrics: Json) -> list[str]:
    series = _plotted(predictions)
    bins: dict[str, Reliability] = {}
    lines: dict[str, CoverageSeries] = {}
    for name, scored in series.items():
        body = metrics["overall"] if name == "overall" else metrics["questions"][name]
        calibrated = [p for p in scored if has_distribution(p)]
        if calibrated:
            correct = np.array([is_correct(p) for p in calibrated], dtype=np.float64)
            label = f"{name} (ECE {body['calibration']['ece']:.3f}, {len(calibrated)} rows)"
            bins[label] = reliability(_unit(p.confidence for p in calibrated), correct, bins=ECE_BINS)
        lines[name] = CoverageSeries(
            coverage_curve(*_curve_inputs(scored)), body["kept"]["share"], body["kept"]["accuracy"]
        )
    written = []
    if bins:
        plot_reliability(directory / RELIABILITY_PLOT, bins)
        written.append(RELIABILITY_PLOT)
    if lines:
        plot_coverage(directory / COVERAGE_PLOT, lines, TARGETS)
        written.append(COVERAGE_PLOT)
    return written


# -- summary.md ------------------------------------------------------------------------------------------

# Ong et al., "RouteLLM: Learning to Route LLMs with Preference Data", arXiv 2406.18665 v4, Tables
# 1-3 (as ../shared/reference/routellm-published.md gives them): router, training data, CPT(50 %)
# and CPT(80 %) in percent of strong calls, APGR. Evaluated on the whole set with 10 quantiles.
_PUBLISHED: dict[str, tuple[tuple[str, str, float, float, float], ...]] = {
    "MMLU": (
        ("random", "-", 50.07, 79.93, 0.500),
        ("BERT", "Arena only", 49.43, 77.80, 0.502),
        ("causal LLM", "Arena only", 48.88, 77.93, 0.499),
        ("matrix factorization", "Arena only", 45.00, 76.86, 0.524),
        ("SW ranking", "Arena only", 55.82, 80.25, 0.473),
        ("BERT", "Arena + golden labels", 41.30, 72.20, 0.572),
        ("causal LLM", "Arena + golden labels", 35.49, 70.31, 0.600),
        ("matrix factorization", "Arena + golden labels", 35.46, 71.40, 0.597),
        ("SW ranking", "Arena + golden labels", 35.40, 71.55, 0.603),
    ),
    "GSM8K": (
        ("random", "-", 50.00, 80.08, 0.497),
        ("BERT", "Arena only", 58.78, 83.84, 0.438),
        ("causal LLM", "Arena only", 56.09, 83.56, 0.461),
        ("matrix factorization", "Arena only", 53.59, 85.24, 0.475),
        ("SW ranking", "Arena only", 54.43, 82.11, 0.475),
        ("BERT", "Arena + judge", 44.76, 79.09, 0.531),
        ("causal LLM", "Arena + judge", 33.64, 63.26, 0.622),
        ("matrix factorization", "Arena + judge", 38.82, 72.62, 0.565),
        ("SW ranking", "Arena + judge", 41.21, 72.20, 0.568),
    ),
}
# The same source: the oracle's CPT(50 %) in percent and APGR, the limit any router has on these labels.
_ORACLE = {"MMLU": (6.25, 1.29), "GSM8K": (11.02, 1.13)}


def benchmark(run: RunInfo, predictions: Sequence[Prediction]) -> str | None:
    """``MMLU`` or ``GSM8K`` when the run's data is RouteLLM's, from its name, task, settings or rows."""
    said = [run.data, run.task or "", *(str(v) for v in run.settings.values())]
    said += [str(p.meta.get(key, "")) for p in predictions[:1] for key in ("benchmark", "data_set", "converter")]
    text = " ".join(said).lower()
    if "gsm8k" in text:
        return "GSM8K"
    if "mmlu" in text or any("subject" in p.meta for p in predictions[:1]):
        return "MMLU"
    return None


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ms(latency: Json) -> str:
    if latency["p50"] is None:
        return "–"
    return f"{latency['p50']:.0f} / {latency['p99']:.0f}"


def _what_was_run(run: RunInfo, metrics: Json) -> list[str]:
    counts = metrics["counts"]
    examples = ", ".join(f"{name}: {count}" for name, count in sorted(run.examples.items())) or "none (zero-shot)"
    policy = f"`{run.policy}`, version `{run.policy_version}`" if run.policy else "none: the rows' own questions"
    rows = [
        ("data", f"`{run.data}` (sha256 `{run.data_sha256[:12]}`…)"),
        ("split", run.split or "all rows of the file"),
        ("engine", f"`{run.engine}`" + (f", model `{run.model}`" if run.model else "")),
        ("policy", policy),
        ("task", run.task or "–"),
        (
            "rows",
            f"{run.rows} run; {len(run.dropped_training_rows)} dropped as the engine's training examples; "
            f"{len(run.problems)} unreadable in the file",
        ),
        ("examples per question", examples),
        (
            "predictions",
            f"{counts['predictions']} over {counts['questions']} question(s): {counts['scored']} scored "
            f"(labelled), {counts['unlabelled']} unlabelled",
        ),
        ("started / finished", f"{run.started_at or '–'} / {run.finished_at or 'not finished'}"),
    ]
    return ["## What was run", "", *_table(("", ""), rows)]


def _headline_row(name: str, body: Json) -> list[str]:
    if not body["n"]:
        return [name, "0", *["–"] * 8]
    calibration, kept = body["calibration"], body["kept"]
    return [
        name,
        str(body["n"]),
        _pct(body["accuracy"]),
        _num(body["macro_f1"]),
        _pct(kept["share"]),
        _pct(kept["accuracy"]),
        _num(calibration["ece"]),
        _num(calibration["brier"]),
        _num(calibration["log_loss"]),
        _ms(body["latency_ms"]),
    ]


def _headline(metrics: Json) -> list[str]:
    header = (
        "",
        "scored",
        "accuracy",
        "macro-F1",
        "kept",
        "accuracy of kept",
        "ECE-15",
        "Brier",
        "log loss",
        "latency p50 / p99 (ms)",
    )
    rows = [_headline_row("**overall**", metrics["overall"])]
    rows += [_headline_row(name, body) for name, body in metrics["questions"].items()]
    lines = [
        "## Headline",
        "",
        "What System 1 kept is what the run's own thresholds kept (each prediction's `kept`: thresholds fixed "
        "before the run, by the policy or fitted on other rows), so *kept* and *accuracy of kept* are the "
        "operating point these thresholds give on new data.",
        "",
        *_table(header, rows),
        '"Overall" pools every scored (row, question) pair of the run: a row with several labelled questions '
        "counts once per question, and its macro-F1 averages over every (question, option) class. Accuracy "
        "counts an unanswered prediction (an engine error) as wrong; calibration uses only the predictions with "
        "a distribution; latency is per row (a row's questions share one engine call).",
        "",
    ]
    if metrics["counts"]["weighted"]:
        lines += [
            "Rows carry weights: accuracy, kept share and accuracy, escalations and calibration are "
            "weighted; macro-F1, curves, AUROC, RouteLLM figures and confusion counts count rows.",
            "",
        ]
    return lines


def _escalations(metrics: Json) -> list[str]:
    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [
        (
            name,
            _pct(body["escalation"]["share"]),
            ", ".join(f"{reason} {_pct(item['share'])}" for reason, item in body["escalation"]["by_reason"].items())
            or "–",
        )
        for name, body in groups
        if body["n"]
    ]
    return [
        "## Escalations",
        "",
        "Shares of the scored predictions that System 1 did not keep, by the router's reason.",
        "",
        *_table(("", "escalated", "by reason"), rows),
    ]


def _coverage_md(metrics: Json) -> list[str]:
    def point(body: Json, target: float) -> str:
        at = body["coverage"]["at"][f"{target:.2f}"]
        if at["threshold"] is None:
            return "not reached"
        return f"{_pct(at['coverage'])} (confidence ≥ {at['threshold']:.3f})"

    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [(name, *(point(body, t) for t in TARGETS)) for name, body in groups if body["n"]]
    return [
        "## Coverage at a target accuracy (descriptive only)",
        "",
        "> **Descriptive, not a result.** These thresholds are read off the very rows they are scored on, "
        "so the coverage they show is optimistic for new data. The headline uses thresholds fixed before "
        "the run. The overall line applies one threshold to every question.",
        "",
        *_table(("", *(f"at {t:.0%} accuracy" for t in TARGETS)), rows),
    ]


def _out_of_scope_md(metrics: Json) -> list[str]:
    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [
        (
            name,
            ", ".join(oos["none_options"]),
            oos["rows"],
            oos["positives"],
            _num(oos["auroc_p_none"]),
            _num(oos["auroc_not_max_in_scope"]),
        )
        for name, body in groups
        if body["n"] and (oos := body["out_of_scope"]) is not None
    ]
    if not rows:
        return []
    return [
        "## Out-of-scope detection",
        "",
        'Positives: rows whose label is the "none of these" option.',
        "",
        *_table(("", "none option", "rows", "out of scope", "AUROC of P(none)", "AUROC of 1 − max in-scope"), rows),
    ]


def _verdicts_md(metrics: Json) -> list[str]:
    lines: list[str] = []
    for name, body in [("overall (all rules)", metrics["overall"]), *metrics["questions"].items()]:
        verdicts = body["verdicts"] if body["n"] else None
        if verdicts is None:
            continue
        # A yes/no rule's labels are its violation / ok split again; a choice rule's say which option.
        by_label = verdicts["by_label"] if body["kind"] != "noul" else None
        shares = {**(verdicts["by_violation"] or {}), **(by_label or {})}
        rows = [
            (cls, s["rows"], _pct(s["allowed"]), _pct(s["reviewed"]), _pct(s["denied"])) for cls, s in shares.items()
        ]
        lines += [f"**{name}**", "", *_table(("true class", "rows", "allowed", "reviewed", "denied"), rows)]
    if not lines:
        return []
    return [
        "## Check verdicts",
        "",
        "Per true class, the share of its rows allowed, reviewed and denied "
        "(`violation` / `ok` from each rule's violating option, then a choice rule's own labels).",
        "",
        *lines,
    ]


def _routellm_md(run: RunInfo, metrics: Json, bench: str | None) -> list[str]:
    found = [
        (name, body["routellm"])
        for name, body in metrics["questions"].items()
        if body["n"] and body["routellm"] is not None and body["routellm"]["every_threshold"] is not None
    ]
    if not found:
        return []
    rows = []
    for name, r in found:
        for procedure, key in (("10 quantiles (RouteLLM's)", "quantiles_10"), ("every threshold", "every_threshold")):
            f = r[key]
            rows.append(
                (
                    name,
                    procedure,
                    r["rows"],
                    _pct(r["weak_accuracy"]),
                    _pct(r["strong_accuracy"]),
                    _pct(f["cpt_50"], 2),
                    _pct(f["cpt_80"], 2),
                    _num(f["apgr"]),
                )
            )
    lines = [
        "## RouteLLM routing figures",
        "",
        'Router score: System 1\'s P(no) for "will the weak model answer correctly?", the probability that the '
        "prompt needs the strong model. CPT(x %) is the share of strong calls that recovers x % of the gap "
        "between the models (lower is better); APGR the area under the gap-recovered curve (random ≈ 0.5).",
        "",
        *_table(
            ("question", "thresholds", "rows", "weak correct", "strong correct", "CPT(50 %)", "CPT(80 %)", "APGR"), rows
        ),
    ]
    if bench is None:
        return lines
    oracle_cpt, oracle_apgr = _ORACLE[bench]
    published = [
        (router, data, f"{c50:.2f} %", f"{c80:.2f} %", f"{a:.3f}") for router, data, c50, c80, a in _PUBLISHED[bench]
    ]
    ours = found[0][1]["quantiles_10"]
    scope = f"the `{run.split}` split only" if run.split else "every row of the file"
    return lines + [
        f"### Beside the published {bench} figures",
        "",
        *_table(
            ("router", "trained on", "CPT(50 %)", "CPT(80 %)", "APGR"),
            [
                (
                    "**this run** (System 1)",
                    f"{sum(run.examples.values())} labelled example(s) from this data",
                    _pct(ours["cpt_50"], 2),
                    _pct(ours["cpt_80"], 2),
                    _num(ours["apgr"]),
                ),
                *published,
                ("oracle (the limit on these labels)", "-", f"{oracle_cpt:.2f} %", "-", f"{oracle_apgr:.2f}"),
            ],
        ),
        "How far these compare: the published routers (Ong et al., arXiv 2406.18665, Tables 1–3) were trained on "
        "Chatbot Arena preferences (some with golden labels or a judge's) and scored on the whole set; this run "
        f"is System 1 scored on {scope}, with RouteLLM's procedure (10 quantiles of the score, contaminated "
        "prompts dropped by the converter). On a subset, differences of a few points may be sampling noise; "
        f"{len(run.dropped_training_rows)} row(s) were left out because they were training examples.",
        "",
    ]


def _confusions_md(confusions: Mapping[str, Confusion], metrics: Json) -> list[str]:
    worst = metrics["overall"]["worst_confusions"]
    if not worst:
        return ["## Confusions", "", "No scored prediction was wrong.", ""]
    lines = [
        "## Confusions",
        "",
        f"The most frequent mistakes (true → predicted); every count is in `{CONFUSION_FILE}`.",
        "",
        *_table(
            ("question", "true", "predicted", "rows"),
            [(w["question"], w["true"], w["predicted"], w["count"]) for w in worst],
        ),
    ]
    for name, matrix in confusions.items():
        if len(matrix.labels) <= 10:
            labels = [str(label) for label in matrix.labels]
            rows = [(f"**{t}**", *row) for t, row in zip(labels, matrix.counts.tolist(), strict=True)]
            lines += [f"**{name}** (rows true, columns predicted)", "", *_table(("true \\ predicted", *labels), rows)]
    return lines


def render_summary(
    run: RunInfo,
    metrics: Json,
    confusions: Mapping[str, Confusion],
    *,
    benchmark: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """``summary.md`` from the cleaned metrics: what was run, the headline, then the details."""
    lines = ["# Evaluation report", ""]
    if not metrics["run"]["complete"]:
        lines += ["> **The run is not finished**: these figures cover the predictions written so far.", ""]
    lines += _what_was_run(run, metrics)
    lines += _headline(metrics)
    if metrics["overall"]["n"]:
        lines += _escalations(metrics) + _coverage_md(metrics)
        lines += _out_of_scope_md(metrics) + _verdicts_md(metrics) + _routellm_md(run, metrics, benchmark)
        lines += _confusions_md(confusions, metrics)
    lines += ["## Files", "", *(f"- `{name}`" for name in metrics["files"]), ""]
    if notes:
        lines += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


# -- the report --------------------------------------------------------------------------------------------


def _write_json(path: Path, body: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, ensure_ascii=False, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_report(directory: Path) -> Report:
    """Compute the report of a run directory and write its files beside the predictions.

    Writes ``metrics.json``, ``confusion.json``, ``reliability.png`` and ``coverage.png`` (when
    matplotlib is installed and there is something to draw) and ``summary.md``; an earlier report
    in the directory is replaced. It may run while the run is still going: it reports on the
    predictions written so far, and ``summary.md`` says the run is incomplete.

    Raises:
        ConfigError: the directory has no readable ``run.json``, a bad prediction line, or no
            predictions at all.
    """
    run = read_run(directory)
    predictions, duplicates = dedupe(read_predictions(directory))
    if not predictions:
        raise ConfigError(f"no predictions to report on: {PREDICTIONS_FILE} is empty or missing", path=str(directory))
    metrics, confusions = compute_metrics(run, predictions, duplicates)
    notes: list[str] = []
    files = [RUN_FILE, PREDICTIONS_FILE, METRICS_FILE, CONFUSION_FILE]
    if plotting_available():
        files += _plots(directory, predictions, metrics)
    else:
        notes.append("plots not drawn: matplotlib is not installed (`pip install matplotlib`)")
    files.append(SUMMARY_FILE)
    metrics["files"] = files
    cleaned = clean(metrics)
    _write_json(directory / CONFUSION_FILE, _confusion_json(confusions))
    _write_json(directory / METRICS_FILE, cleaned)
    summary = render_summary(run, cleaned, confusions, benchmark=benchmark(run, predictions), notes=notes)
    (directory / SUMMARY_FILE).write_text(summary, encoding="utf-8")
    return Report(directory=directory, run=run, metrics=cleaned, files=tuple(files), notes=tuple(notes))
