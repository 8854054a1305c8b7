"""Selective prediction: answer only the rows whose confidence reaches a threshold, abstain on the rest.

The accuracy-coverage curve, the largest coverage that reaches a target accuracy, and what one
threshold keeps. The conventions are ``_metrics``'s, which re-exports these.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ._metric_inputs import F64, _reals, _same_length, _unit

__all__ = ["CoverageCurve", "SelectivePoint", "coverage_at", "coverage_curve", "kept_at"]


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
