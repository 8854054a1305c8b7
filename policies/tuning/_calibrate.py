"""Fitting a temperature to labelled decisions, and judging it on held-out ones.

The router calibrates by temperature (``fastslow.router.calibrate``: ``p_i^(1/T)``, renormalised).
The decisions a fit sees were made under the temperature already in the policy, so the fit finds
the factor on top of it and the new temperature is the product. The factor minimises the weighted
log loss on the fit split (golden-section search on log T; the loss is convex in 1/T), and ECE,
Brier and log loss are reported before and after on the held-out split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fastslow.policies.evaluation import brier, ece, log_loss

from ._select import Labelled

__all__ = ["CalibrationFit", "Figures", "figures", "fit_temperature"]

F64 = NDArray[np.float64]
MIN_TEMPERATURE, MAX_TEMPERATURE = math.exp(-4.0), math.exp(4.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Figures:
    n: int
    ece: float
    brier: float
    log_loss: float
    accuracy: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    factor: float
    """The temperature to apply on top of the one the decisions were made under."""
    before: Figures
    """Held-out figures under the policy's current calibration."""
    after: Figures
    """Held-out figures with ``factor`` applied."""
    n_fit: int


def _matrix(rows: Sequence[Labelled]) -> tuple[F64, NDArray[np.int64], F64]:
    """Rows as (log-probabilities with a fixed option order per row, label column, weight).

    Rows of one question share its options; a row's options are sorted so columns line up.
    """
    options = sorted({o for r in rows for o in r.probabilities})
    col = {o: i for i, o in enumerate(options)}
    logp = np.full((len(rows), len(options)), -np.inf)
    for i, r in enumerate(rows):
        for o, p in r.probabilities.items():
            logp[i, col[o]] = math.log(p) if p > 0 else -np.inf
    y = np.array([col[r.label] for r in rows], dtype=np.int64)
    w = np.array([r.weight for r in rows], dtype=np.float64)
    return logp, y, w


def _scaled(logp: F64, temperature: float) -> F64:
    z = np.where(np.isfinite(logp), logp / temperature, -np.inf)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: F64 = e / e.sum(axis=1, keepdims=True)
    return out


def _loss(logp: F64, y: NDArray[np.int64], w: F64, temperature: float) -> float:
    p = _scaled(logp, temperature)[np.arange(len(y)), y]
    return float(np.average(-np.log(np.maximum(p, 1e-12)), weights=w))


def figures(rows: Sequence[Labelled], temperature: float = 1.0) -> Figures:
    logp, y, w = _matrix(rows)
    p = _scaled(logp, temperature)
    top = p.argmax(axis=1)
    correct = (top == y).astype(np.float64)
    return Figures(
        n=len(rows),
        ece=ece(p.max(axis=1), correct, weight=w),
        brier=brier(p, y, weight=w),
        log_loss=log_loss(p, y, weight=w),
        accuracy=float(np.average(correct, weights=w)),
    )


def fit_temperature(fit: Sequence[Labelled], held_out: Sequence[Labelled]) -> CalibrationFit:
    """The temperature factor minimising the fit split's log loss, with held-out figures before and after."""
    if not fit or not held_out:
        raise ValueError("both splits need labelled decisions")
    logp, y, w = _matrix(fit)
    lo, hi = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = _loss(logp, y, w, math.exp(a)), _loss(logp, y, w, math.exp(b))
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = _loss(logp, y, w, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = _loss(logp, y, w, math.exp(b))
    factor = math.exp((lo + hi) / 2.0)
    return CalibrationFit(factor=factor, before=figures(held_out), after=figures(held_out, factor), n_fit=len(fit))
