"""Fitting a task's calibration to labelled decisions, and judging it on held-out ones.

The router calibrates in two steps (``fastslow.router.calibrate``): temperature scaling
(``p_i^(1/T)``, renormalised), then, where one was fitted, a map of the top probability (Platt or
isotonic, ``fastslow.router.Platt`` / ``Isotonic``). The methods:

* ``temperature``: always fitted. The factor on the current temperature minimises the weighted log
  loss on the fit split (golden-section search on log T; the loss is convex in 1/T).
* ``platt``: the temperature, then a Platt map fitted on its top probabilities (``_maps``). Two
  parameters; only with at least ``PLATT_MIN_ROWS`` fit decisions.
* ``isotonic``: the temperature, then an isotonic map. Flexible enough to overfit a small sample
  (Niculescu-Mizil and Caruana, "Predicting good probabilities with supervised learning", ICML
  2005, found it beats Platt only from about a thousand calibration rows); only with at least
  ``ISOTONIC_MIN_ROWS``.
* ``auto``: of the methods the fit split allows, the one whose top probability has the lowest
  weighted Brier score in ``FOLDS``-fold cross-validation on the fit split (each fold fits its own
  temperature and map). The held-out split is never looked at to choose.

What the decisions were made under. The labelled decisions carry the distribution the router
gave under the policy's current calibration, not the engine's own. ``reexpress`` undoes the
current map (exactly for Platt and on an isotonic map's slopes; on its flat pieces the confidences
it gave one value cannot be told apart, and the middle of them is taken) and restates the
distribution at the temperature the fit is a factor on. The fitted calibration is a whole one: its
temperature is the current one times the factor, and its map (or none) replaces the current map
rather than stacking on it, so a second run fits on the same footing as the first. The held-out
figures after the fit are computed through the router's own ``calibrate``, with the numbers rounded
as they are written, so that what is reported is what the router will do; the figures before are
the decisions as they were made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

from fastslow.policies.evaluation import brier, ece, log_loss
from fastslow.router import Calibration, ConfidenceMap, calibrate

from ._maps import apply_map, fit_isotonic, fit_platt, inverse
from ._select import Labelled, TooFewLabels

__all__ = [
    "FOLDS",
    "ISOTONIC_MIN_ROWS",
    "METHODS",
    "PLATT_MIN_ROWS",
    "CalibrationFit",
    "Figures",
    "Method",
    "figures",
    "fit_calibration",
    "fit_temperature",
    "reexpress",
]

F64 = NDArray[np.float64]
MIN_TEMPERATURE, MAX_TEMPERATURE = math.exp(-4.0), math.exp(4.0)
Fitted: TypeAlias = Literal["temperature", "platt", "isotonic"]
Method: TypeAlias = Literal["auto", Fitted]
METHODS: tuple[Fitted, ...] = ("temperature", "platt", "isotonic")
"""The methods ``auto`` chooses among, simplest first (a tie goes to the simpler)."""
PLATT_MIN_ROWS = 200
"""Fit decisions Platt needs: two parameters of a logistic curve, steady from a few hundred rows."""
ISOTONIC_MIN_ROWS = 1000
"""Fit decisions isotonic needs: below about a thousand it overfits (Niculescu-Mizil and Caruana 2005)."""
FOLDS = 5
_MIN_ROWS: dict[str, int] = {"temperature": 1, "platt": PLATT_MIN_ROWS, "isotonic": ISOTONIC_MIN_ROWS}


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
    """Held-out figures under ``calibration`` (with ``factor`` applied)."""
    n_fit: int
    method: Fitted = "temperature"
    """The method chosen (``fit_calibration``)."""
    calibration: Calibration = field(default_factory=Calibration)
    """The whole calibration to write: the new temperature and the map, or none."""
    scores: Mapping[str, float] = field(default_factory=dict)
    """With ``auto``: each eligible method's cross-validated Brier score of the top probability."""
    reason: str = ""
    """Why ``method`` was chosen, in words."""


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
    factor = _factor(*_matrix(fit))
    return CalibrationFit(
        factor=factor,
        before=figures(held_out),
        after=figures(held_out, factor),
        n_fit=len(fit),
        calibration=Calibration(temperature=factor),
    )


def _factor(logp: F64, y: NDArray[np.int64], w: F64) -> float:
    """The temperature minimising the weighted log loss of ``logp``."""
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
    return math.exp((lo + hi) / 2.0)


def reexpress(probabilities: Mapping[str, float], used: Calibration, temperature: float) -> dict[str, float]:
    """A distribution the router gave under ``used``, as temperature ``temperature`` alone gives it.

    ``used``'s map is undone first: the top option goes back to the confidence the map was given
    (``_maps.inverse``), the others keep their proportions. Then ``p^(T_used / T)``, renormalised,
    moves the distribution from ``used.temperature`` to ``temperature``.
    """
    probs = dict(probabilities)
    g = used.confidence_map
    if g is not None and len(probs) > 1:
        top = max(probs, key=probs.__getitem__)
        others = [p for k, p in probs.items() if k != top]
        rest = math.fsum(others)
        if rest > 0.0:
            runner = max(others)
            c = min(1.0, max(inverse(g, probs[top]), runner / (rest + runner)))
            scale = (1.0 - c) / rest
            probs = {k: c if k == top else p * scale for k, p in probs.items()}
    return calibrate(probs, Calibration(temperature=temperature / used.temperature))


def _top(p: F64, y: NDArray[np.int64]) -> tuple[F64, F64, F64]:
    """Top probability, whether the top option is right, and the least a map may give it (``calibrate``)."""
    ranked = np.sort(p, axis=1)
    c = ranked[:, -1]
    runner = ranked[:, -2] if p.shape[1] > 1 else np.zeros_like(c)
    rest = np.maximum(1.0 - c, 0.0)
    floor = np.where(rest > 0.0, runner / np.maximum(rest + runner, 1e-300), 0.0)
    return c, (p.argmax(axis=1) == y).astype(np.float64), floor


def _fit_map(method: str, c: F64, correct: F64, w: F64) -> ConfidenceMap | None:
    if method == "platt":
        return fit_platt(c, correct, w)
    return fit_isotonic(c, correct, w) if method == "isotonic" else None


def _cross_validate(
    logp: F64, y: NDArray[np.int64], w: F64, methods: Sequence[str], folds: int, seed: int
) -> dict[str, float]:
    """Each method's weighted Brier score of the top probability, out of fold."""
    fold = np.random.default_rng(seed).permutation(len(y)) % folds
    totals = dict.fromkeys(methods, 0.0)
    for k in range(folds):
        train, test = fold != k, fold == k
        factor = _factor(logp[train], y[train], w[train])
        c_fit, right_fit, _ = _top(_scaled(logp[train], factor), y[train])
        c, right, floor = _top(_scaled(logp[test], factor), y[test])
        for method in methods:
            g = _fit_map(method, c_fit, right_fit, w[train])
            conf = c if g is None else np.clip(apply_map(g, c), floor, 1.0)
            totals[method] += float(np.sum(w[test] * (conf - right) ** 2))
    return {m: t / float(w.sum()) for m, t in totals.items()}


def fit_calibration(
    fit: Sequence[Labelled],
    held_out: Sequence[Labelled],
    *,
    method: Method = "auto",
    base_temperature: float = 1.0,
    decided: Sequence[Labelled] | None = None,
    folds: int = FOLDS,
    seed: int = 0,
) -> CalibrationFit:
    """Fit a temperature and, where ``method`` and the data allow, a confidence map (module docstring).

    Args:
        fit: Decisions to fit on, as ``base_temperature`` alone gives them (``reexpress``).
        held_out: Decisions to judge on, likewise.
        method: ``auto`` chooses by cross-validation on ``fit``; a method by name is fitted as asked.
        base_temperature: The temperature ``fit`` is under; the new one is it times the factor.
        decided: ``held_out`` as the router gave them under the current calibration, for the
            figures before (``held_out`` itself when omitted).

    Raises:
        TooFewLabels: ``method`` is ``platt`` or ``isotonic`` and ``fit`` has fewer rows than it needs.
    """
    if not fit or not held_out:
        raise ValueError("both splits need labelled decisions")
    n = len(fit)
    eligible = [m for m in METHODS if n >= _MIN_ROWS[m]]
    if method != "auto" and method not in eligible:
        raise TooFewLabels(
            f"{method} calibration needs at least {_MIN_ROWS[method]} labelled decisions to fit on, not {n}: "
            "label more, or use --method auto (which falls back to what the data allow)"
        )
    logp, y, w = _matrix(fit)
    temperature = max(round(base_temperature * _factor(logp, y, w), 4), 1e-4)
    factor = temperature / base_temperature  # the factor as written, so the map is fitted on what runs
    scores: dict[str, float] = {}
    if method != "auto":
        chosen: Fitted = method
        reason = f"{method}, as asked ({n} fit decisions)"
    elif len(eligible) == 1:
        chosen = "temperature"
        reason = (
            f"temperature: {n} fit decisions, too few for platt (at least {PLATT_MIN_ROWS}) "
            f"or isotonic (at least {ISOTONIC_MIN_ROWS})"
        )
    else:
        scores = _cross_validate(logp, y, w, eligible, folds, seed)
        chosen = min(eligible, key=lambda m: scores[m])
        tried = ", ".join(f"{m} {scores[m]:.5f}" for m in eligible)
        left = [m for m in METHODS if m not in eligible]
        reason = f"{chosen}: the lowest {folds}-fold cross-validated Brier score of the top probability on {n} fit " + (
            f"decisions ({tried})" + (f"; {left[0]} needs at least {_MIN_ROWS[left[0]]}" if left else "")
        )
    g: ConfidenceMap | None = None
    if chosen != "temperature":
        c, right, _ = _top(_scaled(logp, factor), y)
        g = _fit_map(chosen, c, right, w)
        if g is None:
            reason += f"; no increasing {chosen} map fits these decisions, so temperature alone"
            chosen = "temperature"
    runs = Calibration(temperature=factor, confidence_map=g)
    after = [replace(r, probabilities=calibrate(r.probabilities, runs)) for r in held_out]
    return CalibrationFit(
        factor=factor,
        before=figures(decided if decided is not None else held_out),
        after=figures(after),
        n_fit=n,
        method=chosen,
        calibration=Calibration(temperature=temperature, confidence_map=g),
        scores=scores,
        reason=reason,
    )
