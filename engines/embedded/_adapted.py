"""Few-shot adaptation of a choice's head: a contrastive projection and a nearest-neighbour blend.

A softmax layer on frozen embeddings is limited by the embedder's geometry: two intents the model
places close together stay close. With ten examples an intent there is too little data to fine-tune
the model, but enough to learn a linear map of its embeddings in which each option's examples pull
together and the others push apart (supervised contrastive loss, Khosla et al. 2020), started at
the identity and held near it by a penalty, so a few examples cannot fold the space. On the mapped,
unit-length embeddings a calibrated softmax head (``_head``) and a soft vote of the nearest examples
each give a distribution; the answer blends them.

Everything the blend learns (its weight, the vote's sharpness, the head's temperature and a final
temperature) is fitted on out-of-fold predictions: each fold's map and head are trained without the
fold, so the figures the calibration sees are those of states the map never saw. Chosen on
Banking77's training split (10-shot sets against the split's other rows; ``bench/adapted.py``),
never its test split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._head import SoftmaxHead, _fit_temperature, _folds, _log_loss, _train, fit_head, one_blas_thread

__all__ = ["AdaptedHead", "fit_adapted_head"]

F64 = NDArray[np.float64]

CONTRAST_TEMPERATURE = 0.1
"""The supervised contrastive loss's temperature on cosine similarities."""
IDENTITY_PENALTY = 10.0
"""Weight of ``||P - I||^2 / d``, which keeps the map near the embedder's own geometry."""
STEPS = 60
BATCH = 1024
"""Most examples one step of the contrastive loss sees (a random draw beyond that)."""
LEARNING_RATE = 0.003
NEIGHBOURS = 10
BLENDS: tuple[float, ...] = tuple(i / 10 for i in range(11))
"""Weights of the softmax head tried (the vote gets the rest)."""
VOTE_TEMPERATURES: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2)
MIN_PER_OPTION = 2
"""Fewer examples of some option than this: no folds to fit the blend on, so no adaptation."""


def _unit(x: F64) -> F64:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: F64 = x / np.where(norms > 0, norms, 1.0)
    return out


class _Pairs:
    """A batch's positive pairs: the contrastive loss's target rows, and which rows anchor."""

    def __init__(self, y: NDArray[np.intp]) -> None:
        same = (y[:, None] == y[None, :]) & ~np.eye(len(y), dtype=bool)
        positives = same.sum(axis=1)
        self.anchors: NDArray[np.bool_] = positives > 0
        self.any = bool(self.anchors.any())
        target = np.where(same, 1.0 / np.maximum(positives, 1)[:, None], 0.0)
        target[~self.anchors] = 0.0
        self.target: NDArray[np.float32] = target.astype(np.float32)
        self.weight = np.float32(1.0 / max(int(self.anchors.sum()), 1))


@one_blas_thread()
def fit_projection(x: F64, y: NDArray[np.intp], *, steps: int = STEPS, seed: int = 0) -> F64:
    """A ``(d, d)`` map trained by Adam on the supervised contrastive loss, from the identity.

    Up to ``BATCH`` examples the batch is all of them; beyond, each step draws ``BATCH`` at random,
    so a step costs the same for 1,000 examples as for 10,000 (the loss is quadratic in the batch).
    """
    d = x.shape[1]
    rng = np.random.default_rng(seed)
    # A step runs in float32 (its four products and the n x n softmax: about twice float64's speed,
    # the softmax's exp far more) and Adam keeps the map in float64: the map ends within about 1e-6
    # of an all-float64 fit.
    x32 = np.asarray(x, dtype=np.float32)
    p = np.eye(d)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    beta1, beta2 = 0.9, 0.999
    whole = _Pairs(y) if len(y) <= BATCH else None  # the same pairs every step: built once
    for step in range(1, steps + 1):
        if whole is None:
            rows = rng.choice(len(y), BATCH, replace=False)
            xb, pairs = x32[rows], _Pairs(y[rows])
        else:
            xb, pairs = x32, whole
        if not pairs.any:
            continue
        u = xb @ p.astype(np.float32)
        norms = np.maximum(np.linalg.norm(u, axis=1, keepdims=True), np.float32(1e-12))
        z = u / norms
        s = z @ z.T
        s *= np.float32(1.0 / CONTRAST_TEMPERATURE)
        np.fill_diagonal(s, -np.inf)
        s -= s.max(axis=1, keepdims=True)
        a = np.exp(s, out=s)
        a /= a.sum(axis=1, keepdims=True)
        a -= pairs.target
        a *= pairs.weight
        a[~pairs.anchors] = 0.0
        g_z = (a + a.T) @ z
        g_z *= np.float32(1.0 / CONTRAST_TEMPERATURE)
        g_u = (g_z - z * np.sum(z * g_z, axis=1, keepdims=True)) / norms
        grad = (xb.T @ g_u).astype(np.float64) + (2.0 * IDENTITY_PENALTY / d) * (p - np.eye(d))
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad * grad
        p -= LEARNING_RATE * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + 1e-8)
    return p


def _vote(z: F64, examples: F64, targets: NDArray[np.intp], k: int, temperature: float) -> F64:
    """Soft votes of each row's ``NEIGHBOURS`` nearest examples, as distributions over ``k`` options."""
    return _vote_from_sims(z @ examples.T, targets, k, temperature)


def _blend(head: F64, vote: F64, weight: float) -> F64:
    return np.log(np.maximum(weight * head + (1.0 - weight) * vote, 1e-12))


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptedHead:
    """``softmax(log(b * head(z) + (1 - b) * vote(z)) / T)`` with ``z = unit(x @ projection)``."""

    head: SoftmaxHead
    """Trained on the mapped embeddings; its temperature is the out-of-fold one."""
    projection: F64
    examples: F64
    """The mapped, unit-length example embeddings the vote looks up."""
    targets: NDArray[np.intp]
    blend: float
    vote_temperature: float
    temperature: float
    cv_log_loss: float
    oof: F64 | None = None
    """The out-of-fold probabilities behind ``cv_log_loss``, one row per example (``SoftmaxHead.oof``)."""

    @property
    def labels(self) -> tuple[str, ...]:
        return self.head.labels

    def probabilities(self, x: NDArray[np.floating]) -> F64:
        z = _unit(np.asarray(x, dtype=np.float64) @ self.projection)
        vote = _vote(z, self.examples, self.targets, len(self.labels), self.vote_temperature)
        logits = _blend(self.head.probabilities(z), vote, self.blend) / self.temperature
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        out: F64 = e / e.sum(axis=1, keepdims=True)
        return out

    def to_arrays(self) -> dict[str, NDArray[Any]]:
        arrays = self.head.to_arrays()
        arrays.update(
            adapt_projection=self.projection.astype(np.float32),
            adapt_examples=self.examples.astype(np.float32),
            adapt_targets=self.targets,
            adapt_scalars=np.array([self.blend, self.vote_temperature, self.temperature, self.cv_log_loss]),
        )
        if self.oof is not None:
            arrays["adapt_oof"] = self.oof.astype(np.float32)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]]) -> AdaptedHead | None:
        if "adapt_projection" not in arrays:
            return None
        blend, vote_temperature, temperature, loss = (float(v) for v in arrays["adapt_scalars"])
        return cls(
            head=SoftmaxHead.from_arrays(arrays),
            projection=np.asarray(arrays["adapt_projection"], dtype=np.float64),
            examples=np.asarray(arrays["adapt_examples"], dtype=np.float64),
            targets=np.asarray(arrays["adapt_targets"], dtype=np.intp),
            blend=blend,
            vote_temperature=vote_temperature,
            temperature=temperature,
            cv_log_loss=loss,
            oof=np.asarray(arrays["adapt_oof"], dtype=np.float64) if "adapt_oof" in arrays else None,
        )


@one_blas_thread()
def fit_adapted_head(
    x: NDArray[np.floating],
    labels: Sequence[str],
    targets: NDArray[np.integer],
    *,
    steps: int = STEPS,
    seed: int = 0,
) -> AdaptedHead | None:
    """Adapt a head to ``x``'s examples, or ``None`` when some option has too few for folds."""
    xs = np.asarray(x, dtype=np.float64)
    y = np.asarray(targets, dtype=np.intp)
    k = len(labels)
    counts = np.bincount(y, minlength=k)
    n_folds = min(5, int(counts.min()))
    if n_folds < MIN_PER_OPTION or k < 2:
        return None
    projection = fit_projection(xs, y, steps=steps, seed=seed)
    z = _unit(xs @ projection)
    head = fit_head(z, labels, y, seed=seed)  # chooses the penalty the folds below reuse
    head_oof = np.zeros((len(y), k))
    vote_sims: list[tuple[NDArray[np.intp], F64, NDArray[np.intp]]] = []
    everything = np.arange(len(y))
    for held in _folds(y, n_folds, seed):
        keep = np.setdiff1d(everything, held)
        p_f = fit_projection(xs[keep], y[keep], steps=steps, seed=seed)
        z_f = _unit(xs @ p_f)
        theta = _train(z_f[keep], y[keep], k, head.l2)
        head_oof[held] = z_f[held] @ theta[:-1] + theta[-1]
        vote_sims.append((held, z_f[held] @ z_f[keep].T, keep))
    head_temperature = _fit_temperature(head_oof, y)
    head_probs = np.exp(head_oof / head_temperature - _lse(head_oof / head_temperature))
    best: tuple[float, float, float, float] | None = None  # (loss, blend, vote temperature, temperature)
    for vote_temperature in VOTE_TEMPERATURES:
        vote = np.zeros((len(y), k))
        for held, sims, keep in vote_sims:
            vote[held] = _vote_from_sims(sims, y[keep], k, vote_temperature)
        for blend in BLENDS:
            logits = _blend(head_probs, vote, blend)
            temperature = _fit_temperature(logits, y)
            loss = _log_loss(logits / temperature, y)
            if best is None or loss < best[0] - 1e-9:
                best = (loss, blend, vote_temperature, temperature)
    assert best is not None
    loss, blend, vote_temperature, temperature = best
    vote = np.zeros((len(y), k))
    for held, sims, keep in vote_sims:
        vote[held] = _vote_from_sims(sims, y[keep], k, vote_temperature)
    oof_logits = _blend(head_probs, vote, blend) / temperature
    return AdaptedHead(
        head=SoftmaxHead(
            labels=head.labels, weights=head.weights, bias=head.bias, temperature=head_temperature, l2=head.l2
        ),
        projection=projection,
        examples=z,
        targets=y,
        blend=blend,
        vote_temperature=vote_temperature,
        temperature=temperature,
        cv_log_loss=loss if math.isfinite(loss) else float("nan"),
        oof=np.exp(oof_logits - _lse(oof_logits)),
    )


def _lse(z: F64) -> F64:
    top = z.max(axis=1, keepdims=True)
    out: F64 = top + np.log(np.exp(z - top).sum(axis=1, keepdims=True))
    return out


def _vote_from_sims(sims: F64, targets: NDArray[np.intp], k: int, temperature: float) -> F64:
    n_near = min(NEIGHBOURS, sims.shape[1])
    near = np.argpartition(-sims, n_near - 1, axis=1)[:, :n_near]
    near_sims = np.take_along_axis(sims, near, axis=1)
    w = np.exp((near_sims - near_sims.max(axis=1, keepdims=True)) / temperature)
    votes = np.zeros((len(sims), k))
    np.add.at(votes, (np.repeat(np.arange(len(sims)), n_near), targets[near].ravel()), w.ravel())
    out: F64 = votes / votes.sum(axis=1, keepdims=True)
    return out
