"""Metrics of ``fastslow eval``: pure functions over numpy arrays, no I/O.

Every function states its exact definition and raises ``ValueError`` on empty or mismatched
input rather than returning a number that means nothing. Shares and rates are fractions in
[0, 1]; convert to percent only when printing.

Conventions shared by all functions:

- ``correct`` is per-row correctness: booleans, or numbers in [0, 1].
- ``weight`` (where accepted) is an optional per-row, non-negative weight; a weighted mean is
  ``sum(w * x) / sum(w)``. Leaving it out is the same as all weights 1.
- ``probs`` is an ``(n, k)`` array whose columns are options in a fixed order and ``labels`` the
  column index of each row's true option.

The RouteLLM metrics (``gap_recovered_curve``, ``apgr``, ``cpt``) follow lm-sys/RouteLLM @ 0b64fda,
``routellm/evals/evaluate.py`` (``generate_results``: ``pct_call_metric`` and ``apgr_metric``) and
``routellm/evals/benchmarks.py`` (``evaluate``: thresholds from ``pd.qcut``, ``>=`` selection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, SupportsFloat, TypeAlias, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fastslow.router import Verdict

__all__ = [
    "Bootstrap",
    "Confusion",
    "CoverageCurve",
    "GapCurve",
    "Label",
    "Reliability",
    "SelectivePoint",
    "VerdictShares",
    "accuracy",
    "apgr",
    "auroc",
    "brier",
    "confusion",
    "coverage_at",
    "coverage_curve",
    "cpt",
    "ece",
    "gap_recovered_curve",
    "kept_at",
    "log_loss",
    "macro_f1",
    "paired_bootstrap",
    "percentiles",
    "reliability",
    "verdict_shares",
]

F64: TypeAlias = NDArray[np.float64]
I64: TypeAlias = NDArray[np.int64]
Label: TypeAlias = str | int
"""An option's name or index, as the rows carry it."""

_VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


# -- input checks ------------------------------------------------------------------------------------


def _vector(values: ArrayLike, name: str) -> NDArray[Any]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name} is empty: a metric over no rows is undefined")
    return array


def _reals(values: ArrayLike, name: str) -> F64:
    array = _vector(values, name)
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    floats = array.astype(np.float64)
    if not np.isfinite(floats).all():
        raise ValueError(f"{name} has NaN or infinite values")
    return floats


def _unit(values: ArrayLike, name: str) -> F64:
    floats = _reals(values, name)
    if ((floats < 0.0) | (floats > 1.0)).any():
        raise ValueError(f"{name} must lie in [0, 1]")
    return floats


def _same_length(name: str, first: NDArray[Any], *others: NDArray[Any]) -> None:
    for other in others:
        if len(other) != len(first):
            raise ValueError(f"{name}: arrays have different lengths ({len(first)} and {len(other)})")


def _weights(weight: ArrayLike | None, n: int) -> F64:
    if weight is None:
        return np.ones(n)
    w = _reals(weight, "weight")
    if len(w) != n:
        raise ValueError(f"weight has {len(w)} rows, the data {n}")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weight must be non-negative with a positive sum")
    return w


def _bins(bins: int) -> None:
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")


# -- labels --------------------------------------------------------------------------------------------


def accuracy(truth: ArrayLike, predicted: ArrayLike, weight: ArrayLike | None = None) -> float:
    """The (weighted) share of rows whose prediction equals the truth: ``sum(w * [t == p]) / sum(w)``.

    Labels may be names or indices. Raises ``ValueError`` on empty or mismatched input.
    """
    t, p = _vector(truth, "truth"), _vector(predicted, "predicted")
    _same_length("accuracy", t, p)
    w = _weights(weight, len(t))
    return float(np.average(t == p, weights=w))


def macro_f1(truth: ArrayLike, predicted: ArrayLike) -> float:
    """The unweighted mean of per-label F1 over every label present in ``truth`` or ``predicted``.

    Per label: precision = tp / (tp + fp), recall = tp / (tp + fn), F1 = 2PR / (P + R). A label
    never predicted has precision 0, a label never true has recall 0, and F1 is 0 when P + R = 0
    (scikit-learn's ``f1_score(average="macro", zero_division=0)``). Labels absent from both
    arrays do not count, so the score does not depend on the option list.
    """
    t, p = _vector(truth, "truth"), _vector(predicted, "predicted")
    _same_length("macro_f1", t, p)
    counts = _counts(t, p, np.unique(np.concatenate([t, p])))
    tp = np.diag(counts).astype(np.float64)
    predicted_n, true_n = counts.sum(axis=0), counts.sum(axis=1)
    # 2PR / (P + R) simplifies to 2tp / (predicted + true), which is 0 (not 0/0) whenever tp is 0
    # and the label occurs at all; every label here occurs in one of the arrays.
    return float(np.mean(2 * tp / (predicted_n + true_n)))


class Confusion(NamedTuple):
    """Counts of (true, predicted) pairs and the most frequent mistakes."""

    labels: tuple[Label, ...]
    """Row and column order of ``counts``."""
    counts: I64
    """``counts[i, j]``: rows whose truth is ``labels[i]`` and prediction ``labels[j]``."""
    worst: tuple[tuple[Label, Label, int], ...]
    """(true, predicted, count) off the diagonal, most frequent first; ties in label order."""


def _counts(t: NDArray[Any], p: NDArray[Any], labels: NDArray[Any]) -> I64:
    k = len(labels)
    # ``labels`` is sorted and holds every value of t and p, so searchsorted is an exact lookup.
    ti, pi = np.searchsorted(labels, t), np.searchsorted(labels, p)
    return np.bincount(ti * k + pi, minlength=k * k).reshape(k, k).astype(np.int64)


def confusion(
    truth: ArrayLike, predicted: ArrayLike, *, labels: Sequence[Label] | None = None, worst: int = 5
) -> Confusion:
    """The confusion matrix (rows true, columns predicted) and the ``worst`` most frequent mistakes.

    ``labels`` fixes the order (and may include labels that never occur); by default it is the
    sorted union of both arrays. A value outside ``labels`` is a ``ValueError``. Mistakes with a
    count of 0 are never listed, so ``worst`` may hold fewer than ``worst`` pairs.
    """
    t, p = _vector(truth, "truth"), _vector(predicted, "predicted")
    _same_length("confusion", t, p)
    present = np.unique(np.concatenate([t, p]))
    order = present if labels is None else np.asarray(labels)
    if labels is not None:
        if len(np.unique(order)) != len(order):
            raise ValueError(f"labels has duplicates: {list(labels)}")
        missing = np.setdiff1d(present, order)
        if missing.size:
            raise ValueError(f"labels not in the given label list: {missing.tolist()}")
    # Count in sorted order (an exact lookup), then permute into the requested order.
    sorted_labels = np.unique(order)
    counts = _counts(t, p, sorted_labels)
    position = np.searchsorted(sorted_labels, order)
    counts = counts[np.ix_(position, position)]
    return Confusion(labels=tuple(order.tolist()), counts=counts, worst=_worst(order, counts, worst))


def _worst(labels: NDArray[Any], counts: I64, k: int) -> tuple[tuple[Label, Label, int], ...]:
    off = counts.copy()
    np.fill_diagonal(off, 0)
    rows, cols = np.nonzero(off)
    # lexsort sorts by its last key first: count descending, then true, then predicted index.
    order = np.lexsort((cols, rows, -off[rows, cols]))[: max(k, 0)]
    names = labels.tolist()
    return tuple((names[rows[i]], names[cols[i]], int(off[rows[i], cols[i]])) for i in order)


# -- calibration -------------------------------------------------------------------------------------


class Reliability(NamedTuple):
    """Per confidence bin, for a reliability diagram; arrays of length ``bins``."""

    lower: F64
    upper: F64
    confidence: F64
    """Mean confidence of the bin's rows; NaN for an empty bin (a plot skips it)."""
    accuracy: F64
    """Mean correctness of the bin's rows; NaN for an empty bin."""
    rows: I64
    """Rows in the bin (``count`` would shadow the tuple method)."""


def _binned(confidence: F64, correct: F64, bins: int, w: F64) -> tuple[F64, F64, F64]:
    """Per bin: total weight, weighted sum of confidence, weighted sum of correctness."""
    # Bin b holds [b/bins, (b+1)/bins); 1.0 falls in the last bin.
    index = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    # numpy's stubs type bincount as integer even with float weights; the values are float64.
    return (
        np.bincount(index, weights=w, minlength=bins).astype(np.float64),
        np.bincount(index, weights=w * confidence, minlength=bins).astype(np.float64),
        np.bincount(index, weights=w * correct, minlength=bins).astype(np.float64),
    )


def _calibration_inputs(confidence: ArrayLike, correct: ArrayLike, bins: int) -> tuple[F64, F64]:
    _bins(bins)
    c, r = _unit(confidence, "confidence"), _unit(correct, "correct")
    _same_length("calibration", c, r)
    return c, r


def reliability(confidence: ArrayLike, correct: ArrayLike, bins: int = 15) -> Reliability:
    """Per equal-width bin of the top-class confidence: mean confidence, accuracy and row count.

    Bins are [b/bins, (b+1)/bins) for b = 0 .. bins-1, the last one closed so that it holds 1.0.
    Empty bins are kept (0 rows, NaN means) so the arrays always have ``bins`` entries.
    """
    c, r = _calibration_inputs(confidence, correct, bins)
    total, conf_sum, right_sum = _binned(c, r, bins, np.ones(len(c)))
    edges = np.linspace(0.0, 1.0, bins + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return Reliability(
            lower=edges[:-1],
            upper=edges[1:],
            confidence=conf_sum / total,
            accuracy=right_sum / total,
            rows=total.astype(np.int64),
        )


def ece(confidence: ArrayLike, correct: ArrayLike, bins: int = 15, weight: ArrayLike | None = None) -> float:
    """Expected calibration error: ``sum_b (W_b / W) * |acc_b - conf_b|`` over the bins of ``reliability``.

    ``W_b`` is the bin's total weight (its row count without ``weight``), ``acc_b`` and ``conf_b``
    the bin's weighted mean correctness and confidence; empty bins add nothing. In [0, 1].
    """
    c, r = _calibration_inputs(confidence, correct, bins)
    w = _weights(weight, len(c))
    total, conf_sum, right_sum = _binned(c, r, bins, w)
    # |acc_b - conf_b| * W_b = |right_sum_b - conf_sum_b|: no division, so empty bins are just 0.
    return float(np.abs(right_sum - conf_sum).sum() / total.sum())


def _probabilities(probs: ArrayLike, labels: ArrayLike) -> tuple[F64, I64]:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"probs must be a non-empty (rows, options) array, got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError("probs must be finite and lie in [0, 1]")
    y = _vector(labels, "labels")
    if y.dtype.kind not in "iu":
        raise ValueError(f"labels must be column indices (integers), got dtype {y.dtype}")
    _same_length("probs and labels", p, y)
    if (y < 0).any() or (y >= p.shape[1]).any():
        raise ValueError(f"labels must lie in [0, {p.shape[1]})")
    return p, y.astype(np.int64)


def brier(probs: ArrayLike, labels: ArrayLike, weight: ArrayLike | None = None) -> float:
    """Multi-class Brier score: the (weighted) mean over rows of ``sum_j (p_j - [j == label])^2``.

    In [0, 2]; 0 for a certain, right forecast. Rows are used as given (not renormalised).
    """
    p, y = _probabilities(probs, labels)
    onehot = np.arange(p.shape[1]) == y[:, None]
    return float(np.average(((p - onehot) ** 2).sum(axis=1), weights=_weights(weight, len(y))))


def log_loss(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12, weight: ArrayLike | None = None) -> float:
    """The (weighted) mean negative natural log of the true option's probability.

    The probability is clipped to [eps, 1] first, so a certain wrong answer costs ``-log(eps)``
    (about 27.6 nats at the default) rather than infinity. Rows are not renormalised.
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    p, y = _probabilities(probs, labels)
    true_p = np.clip(p[np.arange(len(y)), y], eps, 1.0)
    return float(np.average(-np.log(true_p), weights=_weights(weight, len(y))))


# -- ranking -------------------------------------------------------------------------------------------


def _average_ranks(values: F64) -> F64:
    """1-based ranks, tied values sharing the mean of the ranks they span (``rankdata('average')``)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # 0-based rank of each distinct value's first row
    return (first + (counts + 1) / 2.0)[inverse]


def auroc(scores: ArrayLike, positives: ArrayLike) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative) + 0.5 P(tie).

    Computed as the Mann-Whitney U statistic over average ranks,
    ``(R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``, so ties count one half. ``positives`` is
    boolean (or 0/1). NaN when only one class is present (the area is undefined); ``ValueError``
    on empty or mismatched input.
    """
    s = _reals(scores, "scores")
    pos = _vector(positives, "positives")
    _same_length("auroc", s, pos)
    if not np.isin(pos, (0, 1)).all():
        raise ValueError("positives must be boolean or 0/1")
    is_pos = pos.astype(bool)
    n_pos = int(is_pos.sum())
    n_neg = len(is_pos) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    rank_sum = float(_average_ranks(s)[is_pos].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


# -- selective prediction ------------------------------------------------------------------------------


class CoverageCurve(NamedTuple):
    """Answer only rows with confidence >= threshold: one point per distinct confidence, descending."""

    coverage: F64
    """Share of rows kept, increasing."""
    accuracy: F64
    """Mean correctness of the kept rows."""
    threshold: F64
    """The confidence threshold that keeps exactly those rows, decreasing."""


class SelectivePoint(NamedTuple):
    """One operating point: a threshold, the share of rows it keeps and their accuracy."""

    coverage: float
    accuracy: float
    """NaN when no row is kept."""
    threshold: float
    """``inf`` when no threshold reaches the target (nothing kept)."""


def coverage_curve(confidence: ArrayLike, correct: ArrayLike) -> CoverageCurve:
    """Coverage and accuracy for every threshold t in the data, keeping the rows with confidence >= t.

    Rows that tie in confidence enter together (no threshold separates them), so the curve has
    one point per distinct confidence and its last point, coverage 1, has the plain accuracy.
    """
    c, r = _reals(confidence, "confidence"), _unit(correct, "correct")
    _same_length("coverage_curve", c, r)
    order = np.argsort(-c, kind="stable")
    c_sorted, right = c[order], np.cumsum(r[order])
    # The last row of each run of equal confidence (in descending order) closes a point.
    ends = np.flatnonzero(np.append(c_sorted[1:] != c_sorted[:-1], True))
    kept = ends + 1.0
    return CoverageCurve(coverage=kept / len(c), accuracy=right[ends] / kept, threshold=c_sorted[ends])


def coverage_at(confidence: ArrayLike, correct: ArrayLike, target: float) -> SelectivePoint:
    """The largest coverage whose accuracy is >= ``target``, and the threshold that gives it.

    Scans every point of ``coverage_curve`` (accuracy need not fall monotonically). When no
    threshold reaches ``target``: coverage 0, accuracy NaN, threshold ``inf``.
    """
    curve = coverage_curve(confidence, correct)
    ok = np.flatnonzero(curve.accuracy >= target)
    if ok.size == 0:
        return SelectivePoint(coverage=0.0, accuracy=math.nan, threshold=math.inf)
    best = ok[-1]  # coverage increases along the curve
    return SelectivePoint(
        coverage=float(curve.coverage[best]),
        accuracy=float(curve.accuracy[best]),
        threshold=float(curve.threshold[best]),
    )


def kept_at(confidence: ArrayLike, correct: ArrayLike, threshold: float) -> SelectivePoint:
    """Coverage and accuracy of the rows with confidence >= ``threshold`` (accuracy NaN if none)."""
    c, r = _reals(confidence, "confidence"), _unit(correct, "correct")
    _same_length("kept_at", c, r)
    keep = c >= threshold
    n_kept = int(keep.sum())
    acc = float(r[keep].mean()) if n_kept else math.nan
    return SelectivePoint(coverage=n_kept / len(c), accuracy=acc, threshold=float(threshold))


# -- checks ---------------------------------------------------------------------------------------------


class VerdictShares(NamedTuple):
    """Shares of one true class's rows by verdict; the three sum to 1."""

    allowed: float
    reviewed: float
    denied: float
    rows: int
    """The class's row count."""


def verdict_shares(true_classes: ArrayLike, verdicts: ArrayLike) -> dict[Label, VerdictShares]:
    """For each true class (sorted), the share of its rows allowed, reviewed and denied.

    ``verdicts`` hold the kernel's ``Verdict`` values ("allow", "review", "deny"); anything else
    is a ``ValueError``, as is empty or mismatched input.
    """
    t, v = _vector(true_classes, "true_classes"), _vector(verdicts, "verdicts")
    _same_length("verdict_shares", t, v)
    unknown = np.setdiff1d(v, np.asarray(_VERDICTS))
    if unknown.size:
        raise ValueError(f"unknown verdicts {unknown.tolist()}; expected one of {list(_VERDICTS)}")
    classes, class_index = np.unique(t, return_inverse=True)
    # Column j of the match matrix is verdict j; every row matches exactly one (checked above).
    verdict_index = (v[:, None] == np.asarray(_VERDICTS)[None, :]).argmax(axis=1)
    k = len(_VERDICTS)
    counts = np.bincount(class_index * k + verdict_index, minlength=len(classes) * k).reshape(-1, k)
    totals = counts.sum(axis=1)
    shares = counts / totals[:, None]
    column = {verdict: i for i, verdict in enumerate(_VERDICTS)}
    return {
        label: VerdictShares(
            allowed=float(row[column["allow"]]),
            reviewed=float(row[column["review"]]),
            denied=float(row[column["deny"]]),
            rows=int(total),
        )
        for label, row, total in zip(classes.tolist(), shares, totals, strict=True)
    }


# -- latency --------------------------------------------------------------------------------------------


def percentiles(values: ArrayLike, qs: Sequence[float] = (50, 99)) -> dict[float, float]:
    """Each requested percentile (0-100) of ``values``, interpolated linearly between order statistics.

    numpy's default ("linear", Excel's PERCENTILE.INC): the q-th percentile of n sorted values sits
    at position q/100 * (n - 1). ``ValueError`` on empty input or q outside [0, 100].
    """
    x = _reals(values, "values")
    q = np.asarray(qs, dtype=np.float64)
    if q.ndim != 1 or q.size == 0 or ((q < 0) | (q > 100)).any():
        raise ValueError(f"percentiles must be a non-empty list within [0, 100], got {list(qs)}")
    return dict(zip(q.tolist(), np.percentile(x, q).tolist(), strict=True))


# -- RouteLLM --------------------------------------------------------------------------------------------


class GapCurve(NamedTuple):
    """Quality when the highest-scored prompts go to the strong model; points by increasing share."""

    strong_share: F64
    """Share of prompts sent to the strong model, from 0 to 1 (RouteLLM's ``strong_percentage`` / 100)."""
    recovered: F64
    """Performance gap recovered: (quality - weak mean) / (strong mean - weak mean)."""
    quality: F64
    """Mean correctness with that routing."""
    threshold: F64
    """Prompts with score >= threshold go to the strong model (``inf``: none do)."""


def _routing_inputs(score: ArrayLike, weak_correct: ArrayLike, strong_correct: ArrayLike) -> tuple[F64, F64, F64]:
    s = _reals(score, "score")
    weak, strong = _reals(weak_correct, "weak_correct"), _reals(strong_correct, "strong_correct")
    _same_length("gap_recovered_curve", s, weak, strong)
    if weak.mean() == strong.mean():
        raise ValueError("the weak and strong models score the same on average: there is no gap to recover")
    return s, weak, strong


def _every_threshold(s: F64, weak: F64, strong: F64) -> tuple[F64, F64, F64]:
    """(share, quality, threshold) at k = 0 and at the end of each run of tied scores, descending."""
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    gain = np.concatenate([[0.0], np.cumsum((strong - weak)[order])])
    ends = np.flatnonzero(np.append(s_sorted[1:] != s_sorted[:-1], True)) + 1
    k = np.concatenate([[0], ends])
    return k / len(s), (weak.sum() + gain[k]) / len(s), np.concatenate([[math.inf], s_sorted[ends - 1]])


def _quantile_thresholds(s: F64, weak: F64, strong: F64, quantiles: int) -> tuple[F64, F64, F64]:
    """RouteLLM's points: ``pd.qcut(score, quantiles, retbins=True)`` edges, each routing score >= edge."""
    # pd.qcut's edges are the linear-interpolation quantiles at linspace(0, 1, q + 1), as np.quantile.
    edges = np.quantile(s, np.linspace(0.0, 1.0, quantiles + 1))
    chosen = s[None, :] >= edges[:, None]
    # benchmarks.py uses > for the last edge (the maximum), so the curve ends with no strong call.
    chosen[-1] = s > edges[-1]
    thresholds = edges.copy()
    thresholds[-1] = math.inf  # "> max" is ">= inf" in this module's convention
    # A higher edge routes fewer prompts, so the edges reversed give shares in increasing order.
    quality = np.where(chosen, strong, weak).mean(axis=1)[::-1]
    return chosen.mean(axis=1)[::-1], quality, thresholds[::-1]


def gap_recovered_curve(
    score: ArrayLike, weak_correct: ArrayLike, strong_correct: ArrayLike, *, quantiles: int | None = None
) -> GapCurve:
    """Performance gap recovered as a function of the share of prompts routed to the strong model.

    A higher ``score`` means a prompt needs the strong model. Sending the prompts with score >= t
    to the strong model, quality is the mean over all prompts of the strong model's correctness on
    those and the weak model's on the rest; gap recovered = (quality - mean(weak)) /
    (mean(strong) - mean(weak)): 0 with no strong call, 1 with all, above 1 where a router beats
    the strong model by keeping the prompts only the weak model gets right.

    ``quantiles=None`` evaluates every threshold: k = 0, 1, ..., n prompts in descending score,
    except that tied scores move together (as RouteLLM's ``>=`` does), so a run of ties is one
    segment; the straight line across it is the expected curve under random tie-breaking.
    ``quantiles=q`` reproduces RouteLLM's evaluation exactly: q + 1 thresholds at the score's
    quantiles (``pd.qcut(..., q, retbins=True)``, q = 10 in their scripts), the last one routing
    none. Duplicate edges (many tied scores) give repeated points rather than pandas' error.
    ``ValueError`` on empty or mismatched input, or when both models have the same mean.
    """
    if quantiles is not None and quantiles < 1:
        raise ValueError(f"quantiles must be at least 1, got {quantiles}")
    s, weak, strong = _routing_inputs(score, weak_correct, strong_correct)
    if quantiles is None:
        share, quality, threshold = _every_threshold(s, weak, strong)
    else:
        share, quality, threshold = _quantile_thresholds(s, weak, strong, quantiles)
    weak_mean, strong_mean = weak.mean(), strong.mean()
    recovered = (quality - weak_mean) / (strong_mean - weak_mean)
    return GapCurve(strong_share=share, recovered=recovered, quality=quality, threshold=threshold)


def apgr(
    score: ArrayLike, weak_correct: ArrayLike, strong_correct: ArrayLike, *, quantiles: int | None = None
) -> float:
    """Average performance gap recovered: the trapezoid-rule area under ``gap_recovered_curve``.

    RouteLLM's ``apgr_metric`` is ``(trapz(quality, x) - weak * span) / ((strong - weak) * span)``
    over its points sorted by share; the curve always spans x in [0, 1], so this is exactly
    ``trapz(recovered, strong_share)``. A random router scores about 0.5, the weak model alone 0,
    an oracle above 1 when the weak model is right on prompts the strong one gets wrong.
    """
    curve = gap_recovered_curve(score, weak_correct, strong_correct, quantiles=quantiles)
    return float(np.trapezoid(curve.recovered, curve.strong_share))


def cpt(
    score: ArrayLike,
    weak_correct: ArrayLike,
    strong_correct: ArrayLike,
    target: float,
    *,
    quantiles: int | None = None,
) -> float:
    """Call-performance threshold: the smallest share of strong calls that recovers ``target`` of the gap.

    ``target`` and the result are fractions: ``cpt(..., 0.5)`` is RouteLLM's CPT(50 %), and 0.0625
    is their "6.25 %". The share is read off the piecewise-linear curve, interpolating between
    the last point below the target and the first at or above it, as RouteLLM's
    ``np.interp(target, accuracy, strong_percentage)`` does on a rising curve; on a curve that
    falls back (an oracle) this takes the first crossing, where ``np.interp`` is undefined.
    0 for a target <= 0; NaN when no point reaches the target (possible only above 1), where
    RouteLLM's ``np.interp`` would clamp to 100 %.
    """
    curve = gap_recovered_curve(score, weak_correct, strong_correct, quantiles=quantiles)
    x, y = curve.strong_share, curve.recovered
    reached = np.flatnonzero(y >= target)
    if reached.size == 0:
        return math.nan
    j = int(reached[0])
    if j == 0:
        return float(x[0])
    # y[j - 1] < target <= y[j], so the segment rises and the division is safe.
    return float(x[j - 1] + (target - y[j - 1]) * (x[j] - x[j - 1]) / (y[j] - y[j - 1]))


# -- comparing two engines ------------------------------------------------------------------------------


class Bootstrap(NamedTuple):
    """A paired difference ``statistic(a) - statistic(b)`` with its bootstrap uncertainty."""

    difference: float
    """The observed difference on all rows."""
    low: float
    high: float
    """Percentile interval of the resampled differences (95 % by default)."""
    p_value: float
    """Two-sided, for "no difference"; see ``paired_bootstrap``."""


def paired_bootstrap(
    values_a: ArrayLike,
    values_b: ArrayLike,
    *,
    statistic: Callable[[F64], SupportsFloat] = np.mean,
    n: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Bootstrap:
    """Paired bootstrap of ``statistic(values_a) - statistic(values_b)`` over per-row values.

    Row i of both arrays is the same row (e.g. per-row correctness of two engines), so each of the
    ``n`` resamples draws row indices with replacement once and applies them to both arrays. The
    interval is the (1 - level)/2 and (1 + level)/2 percentiles of the resampled differences.
    The p-value centres the resampled differences on zero to stand for the null hypothesis:
    ``(1 + #{|d*_i - d| >= |d|}) / (n + 1)``, which is never 0 and is 1 when d = 0.
    Deterministic for a given ``seed`` (numpy's ``default_rng``). ``ValueError`` on empty or
    mismatched input, ``n < 1`` or ``level`` outside (0, 1).
    """
    a, b = _reals(values_a, "values_a"), _reals(values_b, "values_b")
    _same_length("paired_bootstrap", a, b)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    observed = float(statistic(a)) - float(statistic(b))
    rng = np.random.default_rng(seed)
    rows = len(a)
    draws = np.empty(n)
    # One resample at a time: ``statistic`` is any function of a 1-D array (not necessarily
    # vectorised), and an (n, rows) index matrix would not fit in memory for large sets.
    for i in range(n):
        idx = rng.integers(0, rows, size=rows)
        draws[i] = float(statistic(a[idx])) - float(statistic(b[idx]))
    low, high = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    extreme = int(np.count_nonzero(np.abs(draws - observed) >= abs(observed)))
    return Bootstrap(difference=observed, low=float(low), high=float(high), p_value=(1 + extreme) / (n + 1))
