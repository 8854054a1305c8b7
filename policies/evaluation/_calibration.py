"""Calibration metrics: the reliability diagram, expected calibration error, Brier score, log loss.

``reliability`` and ``ece`` judge the top-class confidence against per-row correctness, ``brier``
and ``log_loss`` the whole ``(n, k)`` distribution against the true option's column. The
conventions are ``_metrics``'s, which re-exports these.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ._metric_inputs import F64, I64, _bins, _same_length, _unit, _vector, _weights

__all__ = ["Reliability", "brier", "ece", "log_loss", "reliability"]


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
