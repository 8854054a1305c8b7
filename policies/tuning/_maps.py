"""Fitting a map of the top probability (Platt scaling, isotonic regression) in numpy, and undoing one.

Both fit the same thing: the chance that the top option is right, as a function of its
(temperature-scaled) probability ``c``, on weighted labelled decisions.

* Platt: ``sigmoid(a * logit(c) + b)``, a weighted logistic regression on ``logit(c)`` by Newton's
  method, with Platt's own smoothed targets (``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)``), which
  keep the slope finite when the data separate.
* Isotonic: weighted pool-adjacent-violators on ``c``, whose blocks are then merged, the two
  neighbours that cost least squared error first, down to ``MAX_KNOTS``; the map runs linearly
  between the blocks' weighted centres, so it is strictly increasing between its first and last
  points (and so can be undone there, see ``inverse``).
"""

from __future__ import annotations

import bisect
import math

import numpy as np
from numpy.typing import NDArray

from fastslow.router import ConfidenceMap, Isotonic, Platt

__all__ = ["MAX_KNOTS", "apply_map", "fit_isotonic", "fit_platt", "inverse"]

F64 = NDArray[np.float64]
MAX_KNOTS = 64
"""The most points an isotonic map keeps, so that it stays readable in the policy file."""
DIGITS = 6
"""Decimals a fitted map's numbers are written with (the map is judged as written)."""
_NEWTON_STEPS = 100


def _logit(c: F64) -> F64:
    c = np.clip(c, Platt.EPS, 1.0 - Platt.EPS)
    out: F64 = np.log(c / (1.0 - c))
    return out


def fit_platt(confidence: F64, correct: F64, weight: F64) -> Platt | None:
    """The Platt map of ``confidence`` to P(correct); ``None`` when no increasing one fits."""
    z, w = _logit(confidence), weight
    positive, negative = float(w[correct > 0.5].sum()), float(w[correct <= 0.5].sum())
    t = np.where(correct > 0.5, (positive + 1.0) / (positive + 2.0), 1.0 / (negative + 2.0))
    x = np.stack([z, np.ones_like(z)], axis=1)
    theta = np.array([1.0, 0.0])

    def loss(th: F64) -> float:
        s = x @ th
        # log(1 + e^s) - t * s, stable for large |s|.
        return float(np.sum(w * (np.logaddexp(0.0, s) - t * s)))

    current = loss(theta)
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        gradient = x.T @ (w * (p - t))
        hessian = (x.T * (w * p * (1.0 - p))) @ x + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        size = 1.0
        while size > 1e-6:
            trial = theta - size * step
            value = loss(trial)
            if value <= current:
                break
            size /= 2.0
        else:
            break
        theta, done = trial, abs(current - value) <= 1e-12 * max(1.0, abs(current))
        current = value
        if done:
            break
    a, b = round(float(theta[0]), DIGITS - 2), round(float(theta[1]), DIGITS - 2)
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0.0:
        return None
    return Platt(a=a, b=b)


def _pav(x: F64, y: F64, w: F64) -> tuple[list[float], list[float], list[float]]:
    """Weighted pool-adjacent-violators on points sorted by ``x``: blocks as (weight, sum w*y, sum w*x).

    Neighbouring blocks with equal means are pooled too, so block means strictly increase.
    """
    ws: list[float] = []
    wy: list[float] = []
    wx: list[float] = []
    for xi, yi, wi in zip(x.tolist(), y.tolist(), w.tolist(), strict=True):
        ws.append(wi)
        wy.append(wi * yi)
        wx.append(wi * xi)
        while len(ws) > 1 and wy[-2] * ws[-1] >= wy[-1] * ws[-2]:
            w_last, wy_last, wx_last = ws.pop(), wy.pop(), wx.pop()
            ws[-1] += w_last
            wy[-1] += wy_last
            wx[-1] += wx_last
    return ws, wy, wx


def _merge_to(ws: list[float], wy: list[float], wx: list[float], knots: int) -> None:
    """Merge neighbouring blocks, the cheapest in weighted squared error first, until ``knots`` remain."""
    while len(ws) > knots:
        w, m = np.array(ws), np.array(wy) / np.array(ws)
        cost = w[:-1] * w[1:] / (w[:-1] + w[1:]) * (m[1:] - m[:-1]) ** 2
        i = int(np.argmin(cost))
        ws[i] += ws.pop(i + 1)
        wy[i] += wy.pop(i + 1)
        wx[i] += wx.pop(i + 1)


def fit_isotonic(confidence: F64, correct: F64, weight: F64, *, max_knots: int = MAX_KNOTS) -> Isotonic | None:
    """The isotonic map of ``confidence`` to P(correct), at most ``max_knots`` points; ``None`` when it is flat."""
    keep = weight > 0.0
    c, y, w = confidence[keep], correct[keep], weight[keep]
    order = np.argsort(c, kind="stable")
    c, y, w = c[order], y[order], w[order]
    # Equal confidences are one point: PAV must not order them by their labels.
    values, first = np.unique(c, return_index=True)
    sum_w = np.add.reduceat(w, first)
    mean_y = np.add.reduceat(w * y, first) / sum_w
    ws, wy, wx = _pav(values, mean_y, sum_w)
    _merge_to(ws, wy, wx, max_knots)
    xs: list[float] = []
    ys: list[float] = []
    for block_w, block_wy, block_wx in zip(ws, wy, wx, strict=True):
        x = round(block_wx / block_w, DIGITS)
        value = min(1.0, max(0.0, round(block_wy / block_w, DIGITS)))
        if xs and x <= xs[-1]:
            continue  # two centres rounded together: keep the first
        xs.append(x)
        ys.append(max(value, ys[-1]) if ys else value)
    if len(xs) < 2:
        return None
    return Isotonic(x=tuple(xs), y=tuple(ys))


def apply_map(g: ConfidenceMap, c: F64) -> F64:
    """``g`` over an array of confidences, as the router computes it one at a time."""
    if isinstance(g, Platt):
        out: F64 = 1.0 / (1.0 + np.exp(-(g.a * _logit(c) + g.b)))
        return out
    interpolated: F64 = np.interp(c, np.array(g.x), np.array(g.y))
    return interpolated


def inverse(g: ConfidenceMap, value: float) -> float:
    """A confidence that ``g`` maps to ``value``: exact for Platt and on an isotonic map's slopes.

    Where an isotonic map is flat (outside its points, or between equal values) the confidences it
    gave ``value`` cannot be told apart: this is the middle of those within its points.
    """
    if isinstance(g, Platt):
        v = min(max(value, Platt.EPS), 1.0 - Platt.EPS)
        z = (math.log(v / (1.0 - v)) - g.b) / g.a
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0.0 else math.exp(z) / (1.0 + math.exp(z))
    x, y, last = g.x, g.y, len(g.x) - 1
    if value <= y[0] or value > y[last]:
        lo = x[0] if value <= y[0] else x[last]
    else:
        lo = _between(x, y, bisect.bisect_left(y, value) - 1, value)  # y[i] < value <= y[i + 1]
    if value >= y[last] or value < y[0]:
        hi = x[last] if value >= y[last] else x[0]
    else:
        hi = _between(x, y, bisect.bisect_right(y, value) - 1, value)  # y[i] <= value < y[i + 1]
    return (lo + hi) / 2.0


def _between(x: tuple[float, ...], y: tuple[float, ...], i: int, value: float) -> float:
    """Where the segment from point ``i`` to point ``i + 1`` reaches ``value`` (``y[i] < y[i + 1]``)."""
    return x[i] + (value - y[i]) / (y[i + 1] - y[i]) * (x[i + 1] - x[i])
