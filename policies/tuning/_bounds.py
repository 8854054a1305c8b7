"""Confidence bounds on a share: a row bootstrap, never looser than Wilson's score interval.

A percentile bootstrap of a share whose rows are all right (or all wrong) has no spread: a few
dozen decisions, all correct, would "show" 100 % accuracy at any level. So every bound here is the
more cautious of the bootstrap's percentile and Wilson's score bound for the same rows, which
needs about ``z^2 t / (1 - t)`` all-correct decisions to show a share ``t`` (88 for 97 % at 95 %).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

__all__ = ["BOOTSTRAP_RESAMPLES", "Resamples", "needed_for", "wilson_lower", "wilson_upper"]

BOOTSTRAP_RESAMPLES = 1000

F64 = NDArray[np.float64]


def _z(level: float) -> float:
    return NormalDist().inv_cdf(level)


def wilson_lower(successes: float, n: float, level: float) -> float:
    """One-sided lower bound at ``level`` on a share from ``successes`` of ``n`` (0 when ``n`` is 0)."""
    if n <= 0:
        return 0.0
    z = _z(level)
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


def wilson_upper(successes: float, n: float, level: float) -> float:
    """One-sided upper bound at ``level`` (1 when ``n`` is 0)."""
    if n <= 0:
        return 1.0
    return 1.0 - wilson_lower(n - successes, n, level)


def needed_for(target: float, level: float) -> int:
    """The fewest decisions, all right, whose Wilson lower bound at ``level`` reaches ``target``."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must lie strictly between 0 and 1, not {target}")
    z = _z(level)
    return math.ceil(z * z * target / (1.0 - target))


class Resamples:
    """One set of bootstrap resamples of ``n`` weighted rows, reused for every candidate threshold.

    Each resample is a vector of row counts (a multinomial draw), so a share over any subset of the
    rows is two dot products per resample.
    """

    def __init__(self, weights: F64, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        n = len(self.weights)
        rng = np.random.default_rng(seed)
        self.counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64) if n else None

    def share_bounds(
        self, numerator: NDArray[np.bool_], denominator: NDArray[np.bool_], level: float
    ) -> tuple[float, float, float]:
        """(share, lower, upper) of weighted ``numerator`` rows among ``denominator`` rows."""
        w = self.weights
        den = float(w[denominator].sum())
        num = float(w[numerator & denominator].sum())
        if den <= 0 or self.counts is None:
            return math.nan, 0.0, 1.0
        share = num / den
        cw = self.counts * w
        dens = cw @ denominator.astype(np.float64)
        nums = cw @ (numerator & denominator).astype(np.float64)
        ok = dens > 0
        shares = nums[ok] / dens[ok]
        # Effective row count of the subset, for Wilson: (sum w)^2 / sum w^2 (the count itself unweighted).
        sub = w[denominator]
        n_eff = float(sub.sum() ** 2 / (sub * sub).sum())
        lower = min(
            float(np.quantile(shares, 1 - level)) if shares.size else 0.0, wilson_lower(share * n_eff, n_eff, level)
        )
        upper = max(
            float(np.quantile(shares, level)) if shares.size else 1.0, wilson_upper(share * n_eff, n_eff, level)
        )
        return share, lower, upper
