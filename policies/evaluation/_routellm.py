"""RouteLLM's metrics of a router: performance gap recovered, its average (APGR) and CPT.

They follow lm-sys/RouteLLM @ 0b64fda, ``routellm/evals/evaluate.py`` (``generate_results``:
``pct_call_metric`` and ``apgr_metric``) and ``routellm/evals/benchmarks.py`` (``evaluate``:
thresholds from ``pd.qcut``, ``>=`` selection), so that figures can be set beside the paper's. The
conventions are ``_metrics``'s, which re-exports these.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ._metric_inputs import F64, _reals, _same_length

__all__ = ["GapCurve", "apgr", "cpt", "gap_recovered_curve"]


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
