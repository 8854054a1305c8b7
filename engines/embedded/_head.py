"""A calibrated softmax head: multinomial logistic regression on embeddings, in numpy.

Training is full-batch L-BFGS on the mean cross-entropy plus an L2 penalty on the weights (the
bias is not penalised). The penalty is chosen from a grid by stratified k-fold cross-validated
log-loss, then one temperature is fitted on the out-of-fold logits of that penalty, so that the
head's probabilities are calibrated rather than just ranked (with a weak prior towards the
uniform distribution for small example sets). With too few examples for cross-validation (an
option with a single example) the head keeps a default penalty and temperature 1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._embedders import BLAS_THREAD_VARIABLES

__all__ = ["SoftmaxHead", "fit_head"]

F64 = NDArray[np.float64]

L2_GRID: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
"""Penalties tried by cross-validation (features are unit-length embeddings)."""
DEFAULT_L2 = 1e-3
MAX_FOLDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SoftmaxHead:
    """A trained head: ``softmax((x @ weights + bias) / temperature)``."""

    labels: tuple[str, ...]
    """Option names, in column order."""
    weights: F64
    """Shape ``(dim, len(labels))``."""
    bias: F64
    temperature: float
    l2: float
    """The penalty cross-validation chose."""
    cv_log_loss: float | None = None
    """Out-of-fold log-loss after temperature scaling; ``None`` when there was too little data."""
    oof: F64 | None = None
    """The out-of-fold probabilities behind ``cv_log_loss``, one row per training row in training
    order (an ensemble fits how it pools its members on them); ``None`` when there were no folds."""

    def probabilities(self, x: NDArray[np.floating]) -> F64:
        """Rows of probabilities over ``labels`` for embeddings ``x`` of shape ``(n, dim)``."""
        return _softmax((np.asarray(x, dtype=np.float64) @ self.weights + self.bias) / self.temperature)

    def to_arrays(self) -> dict[str, NDArray[Any]]:
        """The head as named arrays (for ``np.savez``; no pickling)."""
        arrays: dict[str, NDArray[Any]] = {
            "labels": np.array(self.labels, dtype=str),
            "weights": self.weights,
            "bias": self.bias,
            "scalars": np.array([self.temperature, self.l2, np.nan if self.cv_log_loss is None else self.cv_log_loss]),
        }
        if self.oof is not None:
            arrays["oof"] = self.oof.astype(np.float32)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]]) -> SoftmaxHead:
        temperature, l2, loss = (float(v) for v in arrays["scalars"])
        return cls(
            labels=tuple(str(v) for v in arrays["labels"]),
            weights=np.asarray(arrays["weights"], dtype=np.float64),
            bias=np.asarray(arrays["bias"], dtype=np.float64),
            temperature=temperature,
            l2=l2,
            cv_log_loss=None if math.isnan(loss) else loss,
            oof=np.asarray(arrays["oof"], dtype=np.float64) if "oof" in arrays else None,
        )


def _softmax(z: F64) -> F64:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: F64 = e / e.sum(axis=1, keepdims=True)
    return out


def _log_loss(logits: F64, y: NDArray[np.intp], w: F64 | None = None) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=1))
    return float(np.average(logz - z[np.arange(len(y)), y], weights=w))


def _train(x: F64, y: NDArray[np.intp], k: int, l2: float, start: F64 | None = None, w: F64 | None = None) -> F64:
    """L-BFGS on the penalised (weighted) mean cross-entropy; returns packed ``[W; b]`` of shape ``(dim + 1, k)``."""
    n, d = x.shape
    onehot = np.zeros((n, k))
    onehot[np.arange(n), y] = 1.0
    # Example weights, scaled to mean 1 so the penalty means the same with and without them.
    scale = np.ones(n) if w is None else w * (n / float(w.sum()))

    def loss_grad(theta: F64) -> tuple[float, F64]:
        w, b = theta[:d], theta[d]
        logits = x @ w + b
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(scale * (np.log(s[:, 0]) - z[np.arange(n), y]))) + 0.5 * l2 * float(np.sum(w * w))
        r = (e / s - onehot) * (scale / n)[:, None]
        grad = np.empty_like(theta)
        grad[:d] = x.T @ r + l2 * w
        grad[d] = r.sum(axis=0)
        return loss, grad

    theta = np.zeros((d + 1, k)) if start is None else start.copy()
    f, g = loss_grad(theta)
    history: list[tuple[F64, F64, float]] = []
    for _ in range(500):
        # Two-loop recursion for the search direction.
        q = g.copy()
        alphas = []
        for s_vec, y_vec, rho in reversed(history):
            a = rho * float(np.sum(s_vec * q))
            alphas.append(a)
            q -= a * y_vec
        if history:
            s_vec, y_vec, _ = history[-1]
            q *= float(np.sum(s_vec * y_vec)) / float(np.sum(y_vec * y_vec))
        for (s_vec, y_vec, rho), a in zip(history, reversed(alphas), strict=True):
            q += s_vec * (a - rho * float(np.sum(y_vec * q)))
        direction = -q
        slope = float(np.sum(g * direction))
        if slope >= 0:  # not a descent direction: restart from steepest descent
            history.clear()
            direction, slope = -g, -float(np.sum(g * g))
        step = 1.0
        while True:
            candidate = theta + step * direction
            f_new, g_new = loss_grad(candidate)
            if f_new <= f + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        s_new, y_new = candidate - theta, g_new - g
        sy = float(np.sum(s_new * y_new))
        theta, f_old, f, g = candidate, f, f_new, g_new
        if sy > 1e-12:
            history.append((s_new, y_new, 1.0 / sy))
            if len(history) > 10:
                history.pop(0)
        if float(np.max(np.abs(g))) < 1e-5 or abs(f_old - f) <= 1e-9 * max(1.0, abs(f)):
            break
    return theta


def _fit_temperature(logits: F64, y: NDArray[np.intp], w: F64 | None = None) -> float:
    """The temperature minimising out-of-fold log-loss plus a one-example uniform prior.

    The prior (cross-entropy to the uniform distribution, weighted as one example among ``n``)
    vanishes for large example sets but stops a few dozen perfectly separated examples from
    pushing the temperature towards zero, i.e. towards certainty their cross-validation cannot
    support. Golden-section search on log T in [e^-6, e^3]; the objective is convex in 1/T.
    """
    weight = 1.0 / len(y)
    rows = np.arange(len(y))

    def objective(log_t: float) -> float:
        z = logits / math.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1))
        return float(np.average(lse - z[rows, y], weights=w) + weight * np.mean(lse - z.mean(axis=1)))

    lo, hi = -6.0, 3.0
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = objective(a), objective(b)
    for _ in range(48):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = objective(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = objective(b)
    return math.exp((lo + hi) / 2.0)


def _folds(y: NDArray[np.intp], k: int, seed: int) -> list[NDArray[np.intp]]:
    """Stratified fold index per example: each class's examples are dealt round-robin after a shuffle."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=np.intp)
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        fold[members] = np.arange(len(members)) % k
    return [np.flatnonzero(fold == i) for i in range(k)]


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread while a head trains, unless the operator set a thread count in the environment.

    A head's matrices are (examples x 384) and the adapted head's map (384 x 384): OpenBLAS's
    threads cost far more than they share at that size. The adapted head's map for 24 examples
    took 2.9 s on two threads and 0.46 s on one, on two idle cores, and the gap grows on a busy
    machine; the figures are the same either way. Used as a decorator of the public fits.
    """
    if any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@one_blas_thread()
def fit_head(
    x: NDArray[np.floating],
    labels: Sequence[str],
    targets: Sequence[int] | NDArray[np.integer],
    *,
    weights: Sequence[float] | NDArray[np.floating] | None = None,
    l2_grid: Sequence[float] = L2_GRID,
    seed: int = 0,
) -> SoftmaxHead:
    """Train a calibrated head on embeddings ``x`` with ``targets`` indexing ``labels``.

    ``weights`` weigh the examples in the loss, the cross-validated log-loss and the temperature
    (a policy check's background texts weigh less than its own examples).
    """
    xs = np.asarray(x, dtype=np.float64)
    y = np.asarray(targets, dtype=np.intp)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    k = len(labels)
    counts = np.bincount(y, minlength=k)
    n_folds = min(MAX_FOLDS, int(counts.min()))
    if n_folds < 2:
        theta = _train(xs, y, k, DEFAULT_L2, w=w)
        return SoftmaxHead(labels=tuple(labels), weights=theta[:-1], bias=theta[-1], temperature=1.0, l2=DEFAULT_L2)

    folds = _folds(y, n_folds, seed)
    keeps = [np.setdiff1d(np.arange(len(y)), held) for held in folds]
    starts: list[F64 | None] = [None] * n_folds
    # (log-loss, l2, temperature, warm start, out-of-fold logits)
    best: tuple[float, float, float, F64 | None, F64] | None = None
    for l2 in sorted(l2_grid, reverse=True):  # strongest penalty first; each fit warm-starts the next
        oof = np.zeros((len(y), k))
        for i, (held, keep) in enumerate(zip(folds, keeps, strict=True)):
            starts[i] = _train(xs[keep], y[keep], k, l2, starts[i], None if w is None else w[keep])
            theta_i = starts[i]
            assert theta_i is not None
            oof[held] = xs[held] @ theta_i[:-1] + theta_i[-1]
        temperature = _fit_temperature(oof, y, w)
        loss = _log_loss(oof / temperature, y, w)
        if best is None or loss < best[0]:
            best = (loss, l2, temperature, starts[0], oof)
    assert best is not None
    loss, l2, temperature, start, best_oof = best
    theta = _train(xs, y, k, l2, start, w)
    return SoftmaxHead(
        labels=tuple(labels),
        weights=theta[:-1],
        bias=theta[-1],
        temperature=temperature,
        l2=l2,
        cv_log_loss=loss,
        oof=_softmax(best_oof / temperature),
    )
