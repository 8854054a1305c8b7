"""The calibration forms of ``bench/fit_zero_shot.py`` and their fits: temperatures and Platt scaling, by Newton.

Its own module so that ``fit_zero_shot.py`` stays small. Choosing among the forms, and writing the
calibration file, is ``_zero_shot_fit.py``'s.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from _zero_shot_sets import Item
from numpy.typing import NDArray

from fastslow.engines.embedded.tools import ZeroShotCalibration

F64 = NDArray[np.float64]
FLOOR = 1e-12


@dataclass(frozen=True, slots=True)
class Arrays:
    """A set's raw distributions as arrays: per K, log-probabilities (n, K) and label indices."""

    groups: list[str]
    by_k: dict[int, tuple[F64, NDArray[np.intp], F64]]  # K -> (log p, label, weight)


def _arrays(items: Sequence[Item], probs: Sequence[dict[str, float]], weights: Sequence[float]) -> Arrays:
    buckets: dict[int, tuple[list[list[float]], list[int], list[float]]] = defaultdict(lambda: ([], [], []))
    for item, p, w in zip(items, probs, weights, strict=True):
        options = item.options
        b = buckets[len(options)]
        b[0].append([math.log(max(p[o], FLOOR)) for o in options])
        b[1].append(options.index(item.label))
        b[2].append(w)
    by_k = {k: (np.array(v[0]), np.array(v[1], dtype=np.intp), np.array(v[2])) for k, v in buckets.items()}
    return Arrays(sorted({i.group for i in items}), by_k)


def _features(form: str, k: int) -> F64:
    return np.array([1.0, math.log(k)]) if form == "temperature_log_k" else np.array([1.0])


def _fit_temperature(data: Arrays, form: str) -> F64:
    """Inverse temperature ``beta = w . f(K)`` minimising the weighted log loss (convex: Newton)."""
    w = np.zeros(2 if form == "temperature_log_k" else 1)
    w[0] = 1.0

    def loss_grad_hess(w: F64) -> tuple[float, F64, F64]:
        loss, grad, hess = 0.0, np.zeros_like(w), np.zeros((len(w), len(w)))
        for k, (logp, y, wt) in data.by_k.items():
            f = _features(form, k)
            beta = float(f @ w)
            z = beta * logp
            top = z.max(axis=1, keepdims=True)
            e = np.exp(z - top)
            lse = np.log(e.sum(axis=1)) + top[:, 0]
            q = e / e.sum(axis=1, keepdims=True)
            true = logp[np.arange(len(y)), y]
            loss += float(np.sum(wt * (lse - beta * true)))
            mean = (q * logp).sum(axis=1)
            var = (q * logp**2).sum(axis=1) - mean**2
            grad += float(np.sum(wt * (mean - true))) * f
            hess += float(np.sum(wt * var)) * np.outer(f, f)
        return loss, grad, hess

    for _ in range(100):
        loss, grad, hess = loss_grad_hess(w)
        step = np.linalg.solve(hess + 1e-9 * np.eye(len(w)), grad)
        t = 1.0
        while t > 1e-6:
            cand = w - t * step
            if all(float(_features(form, k) @ cand) > 0 for k in data.by_k) and loss_grad_hess(cand)[0] <= loss:
                break
            t /= 2
        w = w - t * step
        if float(np.abs(t * step).max()) < 1e-8:
            break
    return w


def _noul_x(data: Arrays) -> tuple[F64, F64, F64]:
    """logit P(yes), whether the label is yes, and weights, of a yes/no set (options ``yes``, ``no``)."""
    ((logp, y, wt),) = data.by_k.values()
    x = logp[:, 0] - logp[:, 1]  # options are ("yes", "no")
    return x, (y == 0).astype(np.float64), wt


def _fit_platt(data: Arrays, with_bias: bool) -> F64:
    """Slope (and bias) on logit P(yes) minimising the weighted log loss (logistic regression, Newton)."""
    x, t, wt = _noul_x(data)
    feats = np.stack([x, np.ones_like(x)], axis=1) if with_bias else x[:, None]
    w = np.zeros(feats.shape[1])
    w[0] = 1.0
    for _ in range(100):
        z = feats @ w
        p = 1.0 / (1.0 + np.exp(-z))
        grad = feats.T @ (wt * (p - t))
        hess = (feats * (wt * p * (1 - p))[:, None]).T @ feats + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w = w - step
        if float(np.abs(step).max()) < 1e-10:
            break
    return w


FORMS = {"choice": ("identity", "temperature", "temperature_log_k"), "noul": ("identity", "temperature", "platt")}


def _calibration(
    engine: str, model: str, kind: str, form: str, w: F64, k_range: tuple[int, int]
) -> ZeroShotCalibration:
    if form == "identity":
        return ZeroShotCalibration(engine=engine, model=model, kind=kind, form="identity")  # type: ignore[arg-type]
    if kind == "noul":
        bias = float(w[1]) if form == "platt" else 0.0
        return ZeroShotCalibration(engine=engine, model=model, kind="noul", form="platt", slope=float(w[0]), bias=bias)
    return ZeroShotCalibration(
        engine=engine,
        model=model,
        kind=kind,  # type: ignore[arg-type]
        form="temperature",
        beta0=float(w[0]),
        beta_log_k=float(w[1]) if form == "temperature_log_k" else 0.0,
        k_min=k_range[0],
        k_max=k_range[1],
    )


def _fit(engine: str, model: str, kind: str, form: str, data: Arrays) -> ZeroShotCalibration:
    ks = sorted(data.by_k)
    if form == "identity":
        return _calibration(engine, model, kind, form, np.zeros(0), (ks[0], ks[-1]))
    if kind == "noul":
        w = _fit_platt(data, with_bias=form == "platt")
    else:
        w = _fit_temperature(data, form)
    return _calibration(engine, model, kind, form, w, (ks[0], ks[-1]))


def _group_sizes(items: Sequence[Item]) -> dict[str, int]:
    """Rows of each fit set (group) in ``items``, by name."""
    return dict(sorted(Counter(item.group for item in items).items()))


def _equal_weights(items: Sequence[Item]) -> list[float]:
    """Each group (set) weighs the same in total, whatever its size."""
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item.group] += 1
    return [1.0 / counts[item.group] for item in items]
