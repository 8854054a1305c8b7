"""The softmax head: learns, returns distributions, and calibrates its temperature by cross-validation."""

from __future__ import annotations

import numpy as np
import pytest

from fastslow.engines.embedded import fit_head


def _blobs(n_per: int, dim: int = 16, spread: float = 0.3, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    centres = np.eye(3, dim)
    x = np.concatenate([c + spread * rng.standard_normal((n_per, dim)) for c in centres])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, [i for i in range(3) for _ in range(n_per)]


def test_the_head_learns_separable_classes() -> None:
    x, y = _blobs(30)
    head = fit_head(x, ["a", "b", "c"], y)
    probs = head.probabilities(x)
    assert probs.shape == (90, 3)
    assert probs.sum(axis=1) == pytest.approx(np.ones(90))
    assert (probs.argmax(axis=1) == np.array(y)).mean() > 0.95
    assert head.cv_log_loss is not None and head.temperature > 0


def test_overlapping_classes_get_uncertain_probabilities() -> None:
    x, y = _blobs(40, spread=3.0, seed=1)
    head = fit_head(x, ["a", "b", "c"], y)
    # Heavy overlap: cross-validation keeps the head from claiming certainty it cannot have.
    assert np.median(head.probabilities(x).max(axis=1)) < 0.9


def test_one_example_per_option_skips_cross_validation() -> None:
    x = np.eye(2, 8)
    head = fit_head(x, ["yes", "no"], [0, 1])
    assert head.cv_log_loss is None and head.temperature == 1.0
    assert head.probabilities(x).argmax(axis=1).tolist() == [0, 1]
