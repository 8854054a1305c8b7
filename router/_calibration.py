"""Calibrating System 1's distribution: temperature scaling, then an optional map of the top probability.

``calibrate`` first scales the whole distribution by the task's (or question's) temperature,
``p_i^(1/T)`` renormalised. A confidence map, where ``fastslow calibrate`` fitted one, then moves
the top option's probability ``c`` to ``g(c)``: Platt scaling (``sigmoid(a * logit(c) + b)``) or an
isotonic map (monotone, piecewise linear through fitted points). The other options share what is
left, ``1 - g(c)``, in the proportions they had, so the distribution still sums to one; and ``g(c)``
is held at or above the level where the top option stays on top. Everything here is pure and cheap:
a few float operations per option, no allocation beyond the result.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

__all__ = ["Calibration", "ConfidenceMap", "Isotonic", "Platt", "calibrate"]

_TOP_MARGIN = 1e-12
"""Relative headroom that keeps the top option strictly above the runner-up through float rounding."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Platt:
    """Platt scaling of the top probability: ``g(c) = sigmoid(a * logit(c) + b)``."""

    EPS: ClassVar[float] = 1e-12
    """The logit is taken of the confidence clipped to ``[EPS, 1 - EPS]``, so it is finite at 0 and 1."""

    a: float = 1.0
    """Slope on the logit; positive, so that a higher confidence stays higher."""
    b: float = 0.0
    """Offset on the logit; negative lowers every confidence."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a > 0.0 and math.isfinite(self.b)):
            raise ValueError("platt needs a finite slope a > 0 and a finite offset b")

    def __call__(self, c: float) -> float:
        c = min(max(c, self.EPS), 1.0 - self.EPS)
        z = self.a * math.log(c / (1.0 - c)) + self.b
        if z >= 0.0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)


@dataclass(frozen=True, slots=True, kw_only=True)
class Isotonic:
    """A monotone map of the top probability through points ``(x_i, y_i)``, linear between them.

    Below the first point it gives ``y[0]``, above the last ``y[-1]`` (as ``numpy.interp``).
    """

    x: tuple[float, ...]
    """Confidences, strictly increasing, in [0, 1]."""
    y: tuple[float, ...]
    """What each confidence becomes: non-decreasing, in [0, 1]."""

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or len(self.x) < 2:
            raise ValueError("an isotonic map needs at least 2 points, as many x as y")
        if not all(0.0 <= v <= 1.0 for v in (*self.x, *self.y)):
            raise ValueError("an isotonic map's points lie in [0, 1]")
        if any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ValueError("an isotonic map's confidences (x) must be strictly increasing")
        if any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ValueError("an isotonic map's values (y) must not decrease")

    def __call__(self, c: float) -> float:
        x, y = self.x, self.y
        if c <= x[0]:
            return y[0]
        if c >= x[-1]:
            return y[-1]
        i = bisect.bisect_right(x, c)  # x[i - 1] <= c < x[i]
        return y[i - 1] + (y[i] - y[i - 1]) * (c - x[i - 1]) / (x[i] - x[i - 1])


ConfidenceMap: TypeAlias = Platt | Isotonic


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Per-task calibration of the engine's distribution: a temperature and an optional confidence map.

    A question (or rule) with an entry in ``questions`` is decided under that entry alone: its own
    temperature and its own map (or none), not the task's.
    """

    temperature: float = 1.0
    confidence_map: ConfidenceMap | None = None
    """Applied to the top probability after temperature scaling (``calibrate``); ``None``: none."""
    questions: Mapping[str, Calibration] = field(default_factory=dict)
    """Question (or rule) name -> its own calibration, where ``fastslow calibrate`` fitted one."""

    def __post_init__(self) -> None:
        if not self.temperature > 0.0:
            raise ValueError("temperature must be positive")
        if any(own.questions for own in self.questions.values()):
            raise ValueError("a question's calibration has no questions of its own")

    def for_question(self, name: str) -> Calibration:
        """The calibration question ``name`` is decided under."""
        own = self.questions.get(name)
        return self if own is None else own


def _scaled(probabilities: Mapping[str, float], temperature: float) -> dict[str, float]:
    """Temperature scaling: p_i^(1/T), renormalised (softmax of log p / T)."""
    if temperature == 1.0:
        return dict(probabilities)
    inv = 1.0 / temperature
    logs = {k: math.log(p) * inv if p > 0.0 else -math.inf for k, p in probabilities.items()}
    top = max(logs.values())
    weights = {k: math.exp(v - top) if v != -math.inf else 0.0 for k, v in logs.items()}
    total = math.fsum(weights.values())
    return {k: w / total for k, w in weights.items()}


def _mapped(probs: dict[str, float], g: ConfidenceMap) -> dict[str, float]:
    if len(probs) < 2:
        return probs  # one option has all the mass whatever the map says
    top = max(probs, key=probs.__getitem__)
    others = [p for k, p in probs.items() if k != top]
    rest = math.fsum(others)
    if rest > 0.0:
        # The runner-up r becomes r * (1 - g) / rest: at most g while g >= r / (rest + r).
        runner = max(others)
        floor = runner / (rest + runner) * (1.0 + _TOP_MARGIN)
        c = min(1.0, max(g(probs[top]), floor))
        scale = (1.0 - c) / rest
        return {k: c if k == top else p * scale for k, p in probs.items()}
    # The top option had all the mass (c == 1): the others share what the map takes from it evenly.
    c = min(1.0, max(g(probs[top]), 1.0 / len(probs) * (1.0 + _TOP_MARGIN)))
    share = (1.0 - c) / (len(probs) - 1)
    return {k: c if k == top else share for k in probs}


def calibrate(probabilities: Mapping[str, float], calibration: Calibration) -> dict[str, float]:
    """Temperature-scale a distribution (``p_i^(1/T)``, renormalised), then map its top probability.

    With a confidence map ``g``, the top option's probability ``c`` becomes ``g(c)``, held within
    ``[r / (rest + r), 1]`` (``r`` the runner-up, ``rest`` the others' total) so that the top option
    stays on top; the others are scaled by ``(1 - g(c)) / rest``. A distribution with a single option
    is left as it is.
    """
    probs = _scaled(probabilities, calibration.temperature)
    g = calibration.confidence_map
    return probs if g is None else _mapped(probs, g)
