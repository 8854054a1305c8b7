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

This module holds the figures on labels, ranking, checks and latency, and re-exports the rest so
that it stays the one place the package imports metrics from: calibration (``_calibration``),
selective prediction (``_selective``), RouteLLM's (``_routellm``) and the paired bootstrap
(``_bootstrap``). All of them check their input with ``_metric_inputs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fastslow.router import Verdict

from ._bootstrap import Bootstrap as Bootstrap
from ._bootstrap import paired_bootstrap as paired_bootstrap
from ._calibration import Reliability as Reliability
from ._calibration import brier as brier
from ._calibration import ece as ece
from ._calibration import log_loss as log_loss
from ._calibration import reliability as reliability
from ._metric_inputs import F64, I64, _reals, _same_length, _vector, _weights
from ._routellm import GapCurve as GapCurve
from ._routellm import apgr as apgr
from ._routellm import cpt as cpt
from ._routellm import gap_recovered_curve as gap_recovered_curve
from ._selective import CoverageCurve as CoverageCurve
from ._selective import SelectivePoint as SelectivePoint
from ._selective import coverage_at as coverage_at
from ._selective import coverage_curve as coverage_curve
from ._selective import kept_at as kept_at

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

Label: TypeAlias = str | int
"""An option's name or index, as the rows carry it."""

_VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


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
