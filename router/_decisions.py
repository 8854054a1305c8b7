"""Pure policy logic: answers in, a ``Decision`` out. No I/O, no event loop.

A decision is kept by System 1 when the calibrated answer clears every threshold of its task;
otherwise it is escalated to System 2 with the reason. Policy checks add a verdict: deny at or above
one probability, allow at or below another, review in between. "None of these" and "escalated" are
ordinary decisions, not exceptions.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

from ._answers import Answer, NoAnswer
from ._calibration import Calibration, calibrate

__all__ = [
    "Calibration",
    "CheckAction",
    "Decision",
    "EngineFailure",
    "OnFailure",
    "Reason",
    "System",
    "Thresholds",
    "Verdict",
    "calibrate",
    "decide_answer",
    "decide_check",
    "escalated_by_system2",
]

_UNCALIBRATED = Calibration()
"""The default calibration: temperature 1, no map (the engine's distribution as it is)."""

System: TypeAlias = Literal[1, 2]
Verdict: TypeAlias = Literal["allow", "review", "deny"]
OnFailure: TypeAlias = Literal["escalate", "fail_closed", "review"]
Reason: TypeAlias = Literal[
    "confident",
    "low_confidence",
    "small_margin",
    "none_of_these",
    "open_ended",
    "weak_signal",
    "no_answer",
    "engine_error",
    "timeout",
    "sticky",
    "oversize",
    "shadow",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """What System 1 must clear for its answer to be kept."""

    min_confidence: float = 0.0
    """Minimum calibrated top probability."""
    min_margin: float = 0.0
    """Minimum gap between the calibrated top and runner-up probabilities."""
    min_label_mass: float | None = None
    """Minimum probability mass the engine put on the labels at all (structured reads)."""
    require_argmax_is_label: bool = False
    min_agreement: float | None = None
    """Minimum share of noise draws agreeing with the averaged answer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckAction:
    """A policy-check rule's action bands over the calibrated P(rule is violated)."""

    deny_at: float = 0.8
    """Deny when the probability is at or above this."""
    allow_at: float = 0.2
    """Allow when the probability is at or below this; review in between."""
    violation: str = "yes"
    """The option that means "the rule is violated" (``yes`` for a noul)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.allow_at <= self.deny_at <= 1.0:
            raise ValueError("need 0 <= allow_at <= deny_at <= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFailure:
    """System 1 could not answer at all."""

    message: str
    timeout: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of one typed decision, with everything needed to explain and log it."""

    task: str
    question: str
    outcome: str | None
    """The chosen option (route, label) or, for a policy check, the verdict; ``None`` while escalated."""
    system: System
    reason: Reason
    escalate: bool = False
    """True when System 2 must (still) be consulted."""
    confidence: float = 0.0
    """Calibrated probability of ``outcome`` (or of the top option when escalated)."""
    threshold: float = 0.0
    """The threshold that was compared against ``confidence`` (or the deny/allow band edge)."""
    probabilities: Mapping[str, float] = field(default_factory=dict)
    """The calibrated distribution System 1 gave, when it gave one."""
    verdict: Verdict | None = None
    policy_version: str = ""
    engine: str = ""
    model: str = ""
    latency_ms: float = 0.0
    detail: str = ""
    """Free text for people: the engine error, what System 2 said, and so on."""
    cost_usd: float | None = None
    """What the System-2 call cost, when its model has a price in the settings."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id, made when the decision is; the decision log and the HTTP API use it."""
    audit: bool = False
    """Drawn into the task's audit sample: a decision System 1 kept that someone should label."""
    audit_rate: float = 0.0
    """The task's ``audit_rate`` when the decision was made (its inverse weighs an audited outcome)."""
    examples_version: str = ""
    """The learned examples System 1 was trained with for this task (``count-hash``); empty when none."""


def audited(decision: Decision, rate: float) -> Decision:
    """``decision`` marked for the audit sample, with probability ``rate``, when System 1 kept it.

    The draw is the decision id's (a uuid4: uniform) first 32 bits against ``rate``, so it needs no
    shared state across replicas and anyone can check it. Escalations and reviews are labelled
    anyway; the audit sample is what makes System 1's kept decisions measurable without bias.
    """
    if rate <= 0.0:
        return decision
    kept = decision.system == 1 and not decision.escalate and decision.verdict != "review"
    draw = int(decision.id[:8], 16) / 0x1_0000_0000 if len(decision.id) >= 8 else 1.0
    return replace(decision, audit=kept and draw < rate, audit_rate=rate)


def _weak_signal(answer: Answer, thresholds: Thresholds) -> str | None:
    signals = answer.signals
    if thresholds.min_label_mass is not None and signals.label_mass is not None:
        if signals.label_mass < thresholds.min_label_mass:
            return f"label_mass {signals.label_mass:.3f} < {thresholds.min_label_mass}"
    if thresholds.require_argmax_is_label and signals.argmax_is_label is False:
        return "the engine's most likely token was not a label"
    if thresholds.min_agreement is not None and signals.agreement is not None:
        if signals.agreement < thresholds.min_agreement:
            return f"agreement {signals.agreement:.3f} < {thresholds.min_agreement}"
    return None


def decide_answer(
    task: str,
    answer: Answer | NoAnswer | EngineFailure,
    *,
    thresholds: Thresholds,
    calibration: Calibration = _UNCALIBRATED,
    none_option: str | None = None,
    policy_version: str = "",
    question: str | None = None,
    examples_version: str = "",
) -> Decision:
    """Keep a routing or classification answer, or say why it must be escalated.

    ``question`` names the decision's question (the answer's own name when omitted);
    ``examples_version`` is the learned set the engine was trained with.
    """
    # One Decision per call, built once: this runs on every routing step, and each replace() is a
    # full re-construction of a 20-field dataclass.
    if isinstance(answer, EngineFailure):
        return Decision(
            task=task,
            question=question or task,
            outcome=None,
            system=1,
            reason="timeout" if answer.timeout else "engine_error",
            escalate=True,
            detail=answer.message,
            policy_version=policy_version,
            examples_version=examples_version,
        )
    if isinstance(answer, NoAnswer):
        return Decision(
            task=task,
            question=question or answer.question,
            outcome=None,
            system=1,
            reason="no_answer",
            escalate=True,
            detail=answer.reason,
            policy_version=policy_version,
            examples_version=examples_version,
            engine=answer.engine,
            model=answer.model,
            latency_ms=answer.latency_ms,
        )
    probs = calibrate(answer.probabilities, calibration)
    ranked = sorted(probs.values(), reverse=True)
    top = max(probs, key=lambda k: probs[k])
    confidence, margin = ranked[0], ranked[0] - ranked[1]
    outcome: str | None = None
    threshold = thresholds.min_confidence
    detail = ""
    reason: Reason
    none_of_these = none_option is not None and top == none_option
    weak = None if none_of_these else _weak_signal(answer, thresholds)
    if none_of_these:
        reason = "none_of_these"
    elif weak is not None:
        reason, threshold, detail = "weak_signal", 0.0, weak
    elif confidence < thresholds.min_confidence:
        reason = "low_confidence"
    elif margin < thresholds.min_margin:
        reason, threshold = "small_margin", thresholds.min_margin
    else:
        reason, outcome = "confident", top
    return Decision(
        task=task,
        question=question or answer.question,
        outcome=outcome,
        system=1,
        reason=reason,
        escalate=outcome is None,
        confidence=confidence,
        threshold=threshold,
        probabilities=probs,
        policy_version=policy_version,
        examples_version=examples_version,
        engine=answer.engine,
        model=answer.model,
        latency_ms=answer.latency_ms,
        detail=detail,
    )


def decide_check(
    task: str,
    answer: Answer | NoAnswer | EngineFailure,
    *,
    action: CheckAction,
    calibration: Calibration = _UNCALIBRATED,
    on_failure: OnFailure = "fail_closed",
    policy_version: str = "",
    question: str | None = None,
) -> Decision:
    """Turn a policy rule's answer into allow / review / deny.

    When System 1 cannot answer, ``on_failure`` says what happens: ``fail_closed`` denies,
    ``review`` sends to a person, ``escalate`` asks System 2. ``question`` names the decision's
    question (the answer's own name when omitted).
    """
    name = question or (answer.question if not isinstance(answer, EngineFailure) else task)
    if isinstance(answer, (EngineFailure, NoAnswer)):
        reason: Reason = "no_answer"
        detail = answer.reason if isinstance(answer, NoAnswer) else answer.message
        if isinstance(answer, EngineFailure):
            reason = "timeout" if answer.timeout else "engine_error"
        failed: Verdict | None = None
        if on_failure != "escalate":
            failed = "deny" if on_failure == "fail_closed" else "review"
        return Decision(
            task=task,
            question=name,
            outcome=failed,
            verdict=failed,
            system=1,
            reason=reason,
            escalate=failed is None,
            detail=detail,
            policy_version=policy_version,
        )
    probs = calibrate(answer.probabilities, calibration)
    p = probs.get(action.violation, 0.0)
    verdict: Verdict
    if p >= action.deny_at:
        verdict, reason, threshold = "deny", "confident", action.deny_at
    elif p <= action.allow_at:
        verdict, reason, threshold = "allow", "confident", action.allow_at
    else:
        verdict, reason, threshold = "review", "low_confidence", action.deny_at
    return Decision(
        task=task,
        question=name,
        outcome=verdict,
        verdict=verdict,
        system=1,
        reason=reason,
        confidence=p,
        threshold=threshold,
        probabilities=probs,
        policy_version=policy_version,
        engine=answer.engine,
        model=answer.model,
        latency_ms=answer.latency_ms,
    )


def escalated_by_system2(
    decision: Decision,
    outcome: str | None,
    *,
    model: str,
    verdict: Verdict | None = None,
    detail: str = "",
    cost_usd: float | None = None,
) -> Decision:
    """The decision after System 2 answered: its outcome with ``system: 2``; the escalation reason is kept."""
    return replace(
        decision,
        outcome=outcome,
        verdict=verdict if verdict is not None else decision.verdict,
        system=2,
        escalate=False,
        model=model,
        detail=detail,
        cost_usd=cost_usd,
    )
