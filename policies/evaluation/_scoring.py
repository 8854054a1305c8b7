"""How the report sees a prediction: scored, correct, kept, with a distribution; rows grouped and deduplicated.

- A prediction is *scored* when it has a label. Scored predictions are what every figure but
  latency is computed over; unlabelled ones are counted, nothing more.
- A scored prediction without an answer (an engine error) is wrong for accuracy and not kept.
- Calibration (ECE, Brier, log loss) needs System 1's distribution: predictions without one are
  left out of it and counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from ._predictions import Prediction

__all__ = [
    "NO_ANSWER",
    "answers_of",
    "by_question",
    "dedupe",
    "has_distribution",
    "is_correct",
    "is_kept",
    "labels_of",
    "latency_per_row",
    "probability",
    "unit",
    "weights",
]

F64: TypeAlias = NDArray[np.float64]
Json: TypeAlias = dict[str, Any]

NO_ANSWER = "(no answer)"
"""The predicted class of an unanswered prediction in the confusion counts."""


# -- rows --------------------------------------------------------------------------------------------


def is_correct(prediction: Prediction) -> bool:
    """Right answer; an unanswered or unlabelled prediction is not correct."""
    return prediction.answer is not None and prediction.answer == prediction.label


def is_kept(prediction: Prediction) -> bool:
    """Kept by the run's thresholds; an unanswered prediction never is, whatever the runner wrote."""
    return prediction.kept and prediction.answer is not None


def has_distribution(prediction: Prediction) -> bool:
    """Whether calibration can use it: an answer, a distribution and a label among the options."""
    return bool(prediction.probabilities) and prediction.answer is not None and prediction.label in prediction.options


def weights(predictions: Sequence[Prediction]) -> F64 | None:
    """Per-prediction weights, or ``None`` when all are 1 or none is positive (then unweighted)."""
    w = np.array([p.weight for p in predictions], dtype=np.float64)
    if w.size == 0 or (w == 1.0).all() or w.sum() <= 0:
        return None
    return w


def unit(values: Iterable[float]) -> F64:
    """The values as an array clipped to [0, 1]."""
    # Engines' distributions may overshoot [0, 1] by rounding; the metrics reject that outright.
    return np.clip(np.fromiter(values, dtype=np.float64), 0.0, 1.0)


def labels_of(scored: Sequence[Prediction]) -> list[str]:
    """The labels of scored predictions."""
    return [p.label or "" for p in scored]  # scored: every label is set


def answers_of(predictions: Sequence[Prediction]) -> list[str]:
    """The answers, ``NO_ANSWER`` for an unanswered prediction."""
    return [p.answer if p.answer is not None else NO_ANSWER for p in predictions]


def probability(prediction: Prediction, option: str) -> float:
    """The probability System 1 gave ``option`` (0 when none)."""
    return float(prediction.probabilities.get(option, 0.0))


def latency_per_row(predictions: Sequence[Prediction]) -> F64:
    """One latency per distinct row: a row's questions share one engine call and its latency."""
    first: dict[str, float] = {}
    for p in predictions:
        first.setdefault(p.row, p.latency_ms)
    return np.fromiter(first.values(), dtype=np.float64)


def dedupe(predictions: Iterable[Prediction]) -> tuple[list[Prediction], int]:
    """One prediction per (row, question), the last written winning, and how many were replaced.

    A resumed run redoes a row whose line was cut short; should it ever write a pair twice, the
    later answer is the one that counts and the pair counts once.
    """
    latest: dict[tuple[str, str], Prediction] = {}
    total = 0
    for p in predictions:
        latest[(p.row, p.question)] = p
        total += 1
    return list(latest.values()), total - len(latest)


def by_question(predictions: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    """Predictions grouped by question, questions in name order."""
    groups: dict[str, list[Prediction]] = {}
    for p in predictions:
        groups.setdefault(p.question, []).append(p)
    return dict(sorted(groups.items()))
