"""Pure policy: answers in, decisions out; every escalation reason and every check action."""

from __future__ import annotations

import math

import pytest

from fastslow.router import (
    Answer,
    Calibration,
    CheckAction,
    EngineFailure,
    NoAnswer,
    Thresholds,
    calibrate,
    decide_answer,
    decide_check,
    escalated_by_system2,
)
from fastslow.router.engine_api import Signals


def _answer(probs: dict[str, float], signals: Signals | None = None, kind: str = "choice") -> Answer:
    return Answer(
        question="q",
        kind=kind,
        probabilities=probs,
        engine="e",
        model="m",
        signals=signals or Signals(),  # type: ignore[arg-type]
    )


STRICT = Thresholds(min_confidence=0.7, min_margin=0.2)


def test_a_confident_answer_is_kept_by_system_1() -> None:
    decision = decide_answer("t", _answer({"a": 0.9, "b": 0.1}), thresholds=STRICT, policy_version="v1")
    assert (decision.outcome, decision.system, decision.reason, decision.escalate) == ("a", 1, "confident", False)
    assert decision.confidence == pytest.approx(0.9)
    assert decision.policy_version == "v1"


def test_low_confidence_escalates_with_the_threshold() -> None:
    decision = decide_answer("t", _answer({"a": 0.6, "b": 0.2, "c": 0.2}), thresholds=STRICT)
    assert (decision.outcome, decision.reason, decision.escalate) == (None, "low_confidence", True)
    assert decision.threshold == 0.7


def test_small_margin_escalates() -> None:
    decision = decide_answer(
        "t", _answer({"a": 0.55, "b": 0.45}), thresholds=Thresholds(min_confidence=0.5, min_margin=0.2)
    )
    assert decision.reason == "small_margin"


def test_none_of_these_escalates_even_when_confident() -> None:
    decision = decide_answer("t", _answer({"a": 0.05, "other": 0.95}), thresholds=STRICT, none_option="other")
    assert (decision.reason, decision.escalate, decision.outcome) == ("none_of_these", True, None)


@pytest.mark.parametrize(
    ("signals", "thresholds"),
    [
        (Signals(label_mass=0.5), Thresholds(min_label_mass=0.9)),
        (Signals(argmax_is_label=False), Thresholds(require_argmax_is_label=True)),
        (Signals(agreement=0.5), Thresholds(min_agreement=0.75)),
    ],
)
def test_a_weak_engine_signal_escalates(signals: Signals, thresholds: Thresholds) -> None:
    decision = decide_answer("t", _answer({"a": 0.99, "b": 0.01}, signals), thresholds=thresholds)
    assert decision.reason == "weak_signal"
    assert decision.detail


def test_no_answer_engine_error_and_timeout_escalate() -> None:
    no = NoAnswer(question="q", kind="choice", reason="refusal", engine="e", model="m")
    assert decide_answer("t", no, thresholds=STRICT).reason == "no_answer"
    err = decide_answer("t", EngineFailure(message="HTTP 503"), thresholds=STRICT)
    assert (err.reason, err.escalate, err.detail) == ("engine_error", True, "HTTP 503")
    assert decide_answer("t", EngineFailure(message="slow", timeout=True), thresholds=STRICT).reason == "timeout"


def test_temperature_scaling_softens_and_sharpens() -> None:
    probs = {"a": 0.8, "b": 0.2}
    soft = calibrate(probs, Calibration(temperature=2.0))
    sharp = calibrate(probs, Calibration(temperature=0.5))
    assert soft["a"] == pytest.approx(math.sqrt(0.8) / (math.sqrt(0.8) + math.sqrt(0.2)))
    assert sharp["a"] > 0.8 > soft["a"]
    assert calibrate(probs, Calibration()) == probs
    with pytest.raises(ValueError):
        Calibration(temperature=0.0)


def test_calibration_applies_before_thresholds() -> None:
    answer = _answer({"a": 0.8, "b": 0.2})
    assert decide_answer("t", answer, thresholds=STRICT).outcome == "a"
    softened = decide_answer("t", answer, thresholds=STRICT, calibration=Calibration(temperature=3.0))
    assert softened.reason == "low_confidence"


ACTION = CheckAction(deny_at=0.8, allow_at=0.3)


@pytest.mark.parametrize(
    ("p", "verdict"), [(0.95, "deny"), (0.8, "deny"), (0.5, "review"), (0.3, "allow"), (0.01, "allow")]
)
def test_check_bands(p: float, verdict: str) -> None:
    decision = decide_check("t", _answer({"yes": p, "no": 1 - p}, kind="noul"), action=ACTION)
    assert decision.verdict == verdict
    assert decision.outcome == verdict
    assert decision.confidence == pytest.approx(p)
    assert not decision.escalate


@pytest.mark.parametrize(
    ("on_failure", "verdict", "escalate"),
    [("fail_closed", "deny", False), ("review", "review", False), ("escalate", None, True)],
)
def test_check_failures_follow_the_policy(on_failure: str, verdict: str | None, escalate: bool) -> None:
    decision = decide_check("t", EngineFailure(message="down"), action=ACTION, on_failure=on_failure)  # type: ignore[arg-type]
    assert (decision.verdict, decision.escalate, decision.reason) == (verdict, escalate, "engine_error")


def test_a_choice_rule_names_its_violating_option() -> None:
    action = CheckAction(deny_at=0.7, allow_at=0.2, violation="exfiltrate")
    answer = _answer({"exfiltrate": 0.75, "internal": 0.25})
    assert decide_check("t", answer, action=action).verdict == "deny"
    with pytest.raises(ValueError):
        CheckAction(deny_at=0.2, allow_at=0.5)


def test_system_2_outcome_keeps_the_escalation_reason() -> None:
    decision = decide_answer("t", _answer({"a": 0.5, "b": 0.5}), thresholds=STRICT)
    settled = escalated_by_system2(decision, "b", model="gpt-x")
    assert (settled.outcome, settled.system, settled.reason, settled.escalate, settled.model) == (
        "b",
        2,
        "low_confidence",
        False,
        "gpt-x",
    )
