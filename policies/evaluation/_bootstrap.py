"""Comparing two engines (or runs) on the same rows: a paired bootstrap of a statistic's difference.

The conventions are ``_metrics``'s, which re-exports these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, SupportsFloat

import numpy as np
from numpy.typing import ArrayLike

from ._metric_inputs import F64, _reals, _same_length

__all__ = ["Bootstrap", "paired_bootstrap"]


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
