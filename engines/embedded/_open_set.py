"""How far a state is from everything a question has examples for: the open-set score.

A softmax head spreads all its probability over the options it was trained on, so a message
that fits none of them is still routed with confidence (on CLINC150, 46 % of out-of-scope
messages were). The open-set score measures typicality instead: the cosine similarity of the
state to its nearest example, after centring the embeddings on the examples' mean (e5's and
MiniLM's vectors all point one way; centring spreads them, and raised out-of-scope AUROC on
CLINC150 domains from 0.895 to 0.915 with e5 at 50 examples a domain, where nearest-centroid,
Mahalanobis, energy, the head's top probability and background-relative scores all did worse:
0.82-0.89; ``bench/report.py``).

It is calibrated on in-scope rows only, the examples themselves, out of fold: each example's
score is taken against the examples of the other folds. A state's conformal p-value is the share
of those in-scope scores at or below its own (interpolated between them), and its probability of being out of scope is
``max(0, 1 - p / rate)``: a state as typical as most examples gets 0, one less typical than every
example gets almost 1, and ``rate`` (``OPEN_SET_RATE``) is the share of in-scope states the score
begins to doubt. At the default route threshold (0.7), a state is escalated by this score alone
when ``p <= 0.3 * rate``: about 3 % of in-scope states at the default rate of 0.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._head import _folds

__all__ = ["OPEN_SET_RATE", "OpenSet", "conformal_p", "fit_open_set", "out_of_fold", "out_of_scope"]

F64 = NDArray[np.float64]

OPEN_SET_RATE = 0.1
FOLDS = 5


def _unit(x: F64) -> F64:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: F64 = x / np.where(norms > 0, norms, 1.0)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSet:
    """A fitted open-set score for one question's examples."""

    center: F64
    """The examples' mean embedding, subtracted before comparing."""
    examples: F64
    """The centred, unit-length example embeddings, shape ``(n, dim)``."""
    reference: F64
    """The examples' out-of-fold scores, sorted: the in-scope distribution."""
    rate: float = OPEN_SET_RATE

    def scores(self, x: NDArray[np.floating]) -> F64:
        """Similarity to the nearest example, for each row of ``x`` (higher: more in scope)."""
        z = _unit(np.asarray(x, dtype=np.float64) - self.center)
        out: F64 = (z @ self.examples.T).max(axis=1)
        return out

    def p_out(self, x: NDArray[np.floating]) -> F64:
        """The probability that each row is out of scope (see the module's docstring)."""
        return self.p_out_of(self.scores(x))

    def p_out_of(self, scores: F64) -> F64:
        """``p_out`` for rows whose ``scores`` are already known."""
        return out_of_scope(conformal_p(scores, self.reference), self.rate)

    def to_arrays(self) -> dict[str, NDArray[Any]]:
        return {
            "open_center": self.center,
            "open_examples": self.examples.astype(np.float32),
            "open_reference": self.reference,
            "open_rate": np.array([self.rate]),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]]) -> OpenSet | None:
        if "open_center" not in arrays:
            return None
        return cls(
            center=np.asarray(arrays["open_center"], dtype=np.float64),
            examples=np.asarray(arrays["open_examples"], dtype=np.float64),
            reference=np.asarray(arrays["open_reference"], dtype=np.float64),
            rate=float(arrays["open_rate"][0]),
        )


def conformal_p(scores: F64, reference: F64) -> F64:
    """The share of in-scope examples no more typical than each of ``scores`` (conformal, interpolated),
    against the sorted in-scope ``reference`` scores.

    Interpolated between the reference scores rather than counted, so that a few dozen examples
    give a smooth value instead of steps of ``1 / (n + 1)``; below the least typical example it
    falls linearly to 0 over one mean gap between reference scores.
    """
    n = len(reference)
    gap = max((float(reference[-1]) - float(reference[0])) / max(n - 1, 1), 1e-6)
    knots = np.concatenate([[reference[0] - gap], reference])
    levels = np.arange(n + 1, dtype=np.float64) / (n + 1)
    return np.asarray(np.interp(scores, knots, levels, right=1.0), dtype=np.float64)


def out_of_scope(p_values: F64, rate: float) -> F64:
    """The probability of being out of scope for conformal ``p_values`` at ``rate`` (the module's docstring)."""
    return np.asarray(np.clip(1.0 - p_values / rate, 0.0, 1.0), dtype=np.float64)


def out_of_fold(z: F64, targets: NDArray[np.intp], seed: int = 0) -> F64:
    """Each row's similarity to its nearest row in the other folds, for centred unit rows ``z``, in row order."""
    reference = np.empty(len(targets))
    everything = np.arange(len(targets))
    # Stratified folds (the head's own), so each class keeps examples on both sides of every split.
    for held in _folds(targets, FOLDS, seed):
        keep = np.setdiff1d(everything, held)
        if held.size and keep.size:
            reference[held] = (z[held] @ z[keep].T).max(axis=1)
    return reference


def fit_open_set(
    x: NDArray[np.floating], targets: NDArray[np.intp], *, rate: float = OPEN_SET_RATE, seed: int = 0
) -> OpenSet | None:
    """Fit the score on a question's example embeddings; ``None`` with fewer than 10 examples."""
    xs = np.asarray(x, dtype=np.float64)
    y = np.asarray(targets, dtype=np.intp)
    if len(xs) < 10:
        return None
    center = xs.mean(axis=0)
    z = _unit(xs - center)
    return OpenSet(center=center, examples=z, reference=np.sort(out_of_fold(z, y, seed)), rate=rate)
