"""Answers recompute confidence from the distribution and repair what servers send."""

from __future__ import annotations

import math

import pytest

from fastslow.router import Answer, Choice, EngineProtocolError, Score
from fastslow.router.engine_api import normalise_distribution


def _answer(probs: dict[str, float], kind: str = "choice") -> Answer:
    return Answer(question="q", kind=kind, probabilities=probs, engine="e", model="m")  # type: ignore[arg-type]


def test_confidence_top_and_margin_come_from_the_distribution() -> None:
    answer = _answer({"a": 0.2, "b": 0.7, "c": 0.1})
    assert answer.top == "b"
    assert answer.confidence == pytest.approx(0.7)
    assert answer.margin == pytest.approx(0.5)
    assert answer.expected is None


def test_score_expected_value_is_zero_indexed() -> None:
    assert _answer({"0": 0.1, "1": 0.1, "2": 0.8}, kind="score").expected == pytest.approx(1.7)


def test_normalise_fills_missing_labels_drops_unknown_and_rescales() -> None:
    question = Choice(criteria={"a": None, "b": None, "c": None})
    probs = normalise_distribution(question, {"a": 0.5, "b": 0.53, "zzz": 0.4})
    assert list(probs) == ["a", "b", "c"]
    assert probs["c"] == 0.0
    assert math.fsum(probs.values()) == pytest.approx(1.0, abs=1e-12)


def test_normalise_reads_string_numbers_and_ignores_negative_or_nan() -> None:
    question = Score(levels=["lo", "hi"])
    probs = normalise_distribution(question, {"0": "0.25", "1": 0.75, "2": float("nan")})
    assert probs == {"0": 0.25, "1": 0.75}
    assert normalise_distribution(question, {"0": -1, "1": 2}) == {"0": 0.0, "1": 1.0}


def test_a_distribution_without_mass_cannot_be_repaired() -> None:
    question = Choice(criteria={"a": None, "b": None})
    with pytest.raises(EngineProtocolError, match="no probability mass"):
        normalise_distribution(question, {"x": 1.0}, engine="jev")
    with pytest.raises(EngineProtocolError, match="not a number"):
        normalise_distribution(question, {"a": "lots"})
