"""Choosing thresholds that state an accuracy: Learn then Test on two disjoint splits of labelled decisions.

Routes and classifications (``tune_thresholds``): the *fit* split orders the candidates. For each
minimum confidence on ``CONFIDENCE_GRID``, from strict to loose, it picks the minimum margin that
keeps the most fit decisions at the target accuracy. The path starts at the point whose lower
bound on the fit split is highest, which must reach the target: stricter points keep fewer
decisions (too few to pass: ``needed_for``), and one failure would end the walk before it began.
The *held-out* split
then tests the points in that order, fixed-sequence (Angelopoulos et al., "Learn then Test",
2021): a point passes when the lower confidence bound of the accuracy of the decisions it keeps
reaches the target, and the walk stops at the first failure. The last point to pass is the answer.
The order comes from data the test does not see, so the bound holds without a multiplicity
correction; the held-out figures reported are those of the test itself.

Checks (``tune_bands``): the candidate bands are ordered before any data is seen (``deny_at`` from
1 downwards, ``allow_at`` from 0 upwards), so every labelled decision takes part in the test:
``deny_at`` is the lowest value whose upper bound on the share of benign states denied stays
within ``max_false_deny``, and ``allow_at`` the highest whose upper bound on the share of
violations allowed stays within ``max_miss``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._bounds import Resamples, needed_for

__all__ = [
    "BAND_GRID",
    "CONFIDENCE_GRID",
    "MARGIN_GRID",
    "BandChoice",
    "Labelled",
    "Point",
    "ThresholdChoice",
    "TooFewLabels",
    "kept_answer",
    "tune_bands",
    "tune_thresholds",
]

CONFIDENCE_GRID: tuple[float, ...] = tuple(round(0.5 + 0.01 * i, 2) for i in range(50)) + (0.995, 0.999)
MARGIN_GRID: tuple[float, ...] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
BAND_GRID: tuple[float, ...] = tuple(round(0.01 * i, 2) for i in range(101))


class TooFewLabels(ValueError):
    """There are not enough labelled decisions to show the target: the message says how many are needed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Labelled:
    """One labelled decision: the (calibrated) distribution System 1 gave, and the true option."""

    probabilities: Mapping[str, float]
    label: str
    none_option: str | None = None
    weight: float = 1.0
    """Inverse sampling probability, for decisions drawn unevenly (an audit sample); 1 otherwise."""


def kept_answer(
    probabilities: Mapping[str, float], min_confidence: float, min_margin: float, none_option: str | None = None
) -> str | None:
    """The option the router keeps under these thresholds (``decide_answer``), ``None`` when it escalates."""
    ranked = sorted(probabilities.items(), key=lambda kv: kv[1], reverse=True)
    top, p = ranked[0]
    margin = p - (ranked[1][1] if len(ranked) > 1 else 0.0)
    if (none_option is not None and top == none_option) or p < min_confidence or margin < min_margin:
        return None
    return top


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """What a pair of thresholds keeps on one split."""

    min_confidence: float
    min_margin: float
    kept: float
    """Weighted share of the split's decisions kept."""
    accuracy: float
    """Weighted accuracy of the kept decisions (NaN when none is kept)."""
    lower: float
    """Lower confidence bound on that accuracy."""
    n_kept: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdChoice:
    min_confidence: float
    min_margin: float
    target: float
    level: float
    fit: Point
    held_out: Point
    """The chosen point's figures on the held-out split (the test's own)."""
    tested: int
    """How many points of the path the held-out split tested (the last one failed unless it was the end)."""
    curve: tuple[Point, ...]
    """Held-out figures along the whole path, for the accuracy-coverage plot."""
    n_fit: int
    n_held_out: int


class _Scored:
    """A split's decisions as arrays: top probability, margin, whether top is right, whether it is "none"."""

    def __init__(self, rows: Sequence[Labelled]) -> None:
        self.n = len(rows)
        top = np.empty(self.n)
        margin = np.empty(self.n)
        right = np.empty(self.n, dtype=bool)
        none = np.empty(self.n, dtype=bool)
        for i, r in enumerate(rows):
            ranked = sorted(r.probabilities.items(), key=lambda kv: kv[1], reverse=True)
            top[i] = ranked[0][1]
            margin[i] = ranked[0][1] - (ranked[1][1] if len(ranked) > 1 else 0.0)
            right[i] = ranked[0][0] == r.label
            none[i] = r.none_option is not None and ranked[0][0] == r.none_option
        self.top, self.margin, self.right, self.none = top, margin, right, none
        self.weights = np.array([r.weight for r in rows], dtype=np.float64)

    def kept(self, c: float, m: float) -> NDArray[np.bool_]:
        out: NDArray[np.bool_] = (self.top >= c) & (self.margin >= m) & ~self.none
        return out


def _point(s: _Scored, boot: Resamples, c: float, m: float, level: float) -> Point:
    kept = s.kept(c, m)
    accuracy, lower, _upper = boot.share_bounds(s.right, kept, level)
    total = float(s.weights.sum())
    return Point(
        min_confidence=c,
        min_margin=m,
        kept=float(s.weights[kept].sum()) / total if total else 0.0,
        accuracy=accuracy,
        lower=lower,
        n_kept=int(kept.sum()),
    )


def tune_thresholds(
    fit: Sequence[Labelled],
    held_out: Sequence[Labelled],
    *,
    target: float,
    level: float = 0.95,
    seed: int = 0,
) -> ThresholdChoice:
    """The loosest thresholds on the path (module docstring) whose held-out accuracy bound meets ``target``.

    Raises:
        TooFewLabels: a split has too few labelled decisions, or no point passes the test.
    """
    needed = needed_for(target, level)
    for name, rows in (("fit", fit), ("held-out", held_out)):
        if len(rows) < needed:
            raise TooFewLabels(
                f"too few labelled decisions in the {name} split: {len(rows)}; showing {target:.1%} accuracy at "
                f"{level:.0%} confidence needs at least {needed} decisions kept, all right, in each split "
                f"(so at least {2 * needed} labelled decisions, more when System 1 escalates some)"
            )
    f, h = _Scored(fit), _Scored(held_out)
    fit_boot = Resamples(f.weights, seed=seed)
    held_boot = Resamples(h.weights, seed=seed + 1)
    path: list[Point] = []
    for c in sorted(CONFIDENCE_GRID, reverse=True):
        best: Point | None = None
        for m in MARGIN_GRID:
            p = _point(f, fit_boot, c, m, level)
            meets = p.n_kept > 0 and p.accuracy >= target
            if meets and (best is None or p.kept > best.kept):
                best = p
        if best is None:
            best = _point(f, fit_boot, c, MARGIN_GRID[-1], level)
        path.append(best)
    # The walk starts where the fit split's lower bound is highest, the point likeliest to pass:
    # stricter points keep fewer decisions (less coverage, and too few to pass), and one failure
    # would end the walk before it began. Chosen on the fit split alone, so the test stays valid.
    start = max(range(len(path)), key=lambda i: (path[i].lower, i))
    if path[start].lower < target:
        raise TooFewLabels(
            f"no thresholds show {target:.1%} at {level:.0%} on the fit split's {len(fit)} decisions (at least "
            f"{needed} kept, all right, are needed): give more labelled decisions or lower --target-accuracy"
        )
    path = path[start:]
    curve = [_point(h, held_boot, p.min_confidence, p.min_margin, level) for p in path]
    chosen: int | None = None
    tested = 0
    for i, p in enumerate(curve):
        tested = i + 1
        if not (p.n_kept > 0 and p.lower >= target):
            break
        chosen = i
    if chosen is None:
        first = curve[0]
        raise TooFewLabels(
            f"the held-out split does not show {target:.1%} at {level:.0%} even at the thresholds likeliest to "
            "pass "
            f"(confidence {first.min_confidence}, margin {first.min_margin}: {first.n_kept} kept, accuracy "
            f"{first.accuracy:.1%}, lower bound {first.lower:.1%}); give more labelled decisions (at least "
            f"{needed} kept ones in the held-out split) or lower --target-accuracy"
        )
    pick = path[chosen]
    return ThresholdChoice(
        min_confidence=pick.min_confidence,
        min_margin=pick.min_margin,
        target=target,
        level=level,
        fit=pick,
        held_out=curve[chosen],
        tested=tested,
        curve=tuple(curve),
        n_fit=len(fit),
        n_held_out=len(held_out),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BandChoice:
    allow_at: float
    deny_at: float
    max_false_deny: float
    max_miss: float
    level: float
    false_deny: float
    """Share of benign states denied at ``deny_at``."""
    false_deny_upper: float
    miss: float
    """Share of violations allowed at ``allow_at``."""
    miss_upper: float
    review_benign: float
    """Share of benign states sent to review (neither allowed nor denied)."""
    review_violations: float
    n_benign: int
    n_violations: int


def tune_bands(
    p_violation: Sequence[float] | NDArray[np.float64],
    violated: Sequence[bool] | NDArray[np.bool_],
    *,
    max_false_deny: float,
    max_miss: float,
    level: float = 0.95,
    weights: Sequence[float] | None = None,
    seed: int = 0,
) -> BandChoice:
    """``allow_at`` / ``deny_at`` for one rule from labelled P(violation) (module docstring).

    Raises:
        TooFewLabels: no benign state or no violation, or too few to bound either share.
    """
    p = np.asarray(p_violation, dtype=np.float64)
    bad = np.asarray(violated, dtype=bool)
    w = np.ones(len(p)) if weights is None else np.asarray(weights, dtype=np.float64)
    n_benign, n_bad = int((~bad).sum()), int(bad.sum())
    for share, count, what in ((max_false_deny, n_benign, "benign states"), (max_miss, n_bad, "violations")):
        needed = needed_for(1.0 - share, level) if share > 0 else math.inf
        if count < needed:
            raise TooFewLabels(
                f"too few labelled {what}: {count}; bounding a share of {share:.1%} at {level:.0%} needs at least "
                f"{needed} of them"
            )
    boot = Resamples(w, seed=seed)
    deny_at, deny_fig = 1.0, (math.nan, 0.0, 1.0)
    for t in sorted(BAND_GRID, reverse=True):
        fig = boot.share_bounds(p >= t, ~bad, level)
        if fig[2] > max_false_deny:
            break
        deny_at, deny_fig = t, fig
    allow_at, allow_fig = 0.0, (math.nan, 0.0, 1.0)
    for t in BAND_GRID:
        fig = boot.share_bounds(p <= t, bad, level)
        if fig[2] > max_miss:
            break
        allow_at, allow_fig = t, fig
    allow_at = min(allow_at, deny_at)
    benign_w, bad_w = w[~bad], w[bad]
    between = (p > allow_at) & (p < deny_at)
    return BandChoice(
        allow_at=allow_at,
        deny_at=deny_at,
        max_false_deny=max_false_deny,
        max_miss=max_miss,
        level=level,
        false_deny=float(benign_w[p[~bad] >= deny_at].sum() / benign_w.sum()),
        false_deny_upper=deny_fig[2],
        miss=float(bad_w[p[bad] <= allow_at].sum() / bad_w.sum()),
        miss_upper=allow_fig[2],
        review_benign=float(benign_w[between[~bad]].sum() / benign_w.sum()),
        review_violations=float(bad_w[between[bad]].sum() / bad_w.sum()),
        n_benign=n_benign,
        n_violations=n_bad,
    )
