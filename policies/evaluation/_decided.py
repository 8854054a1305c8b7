"""A decision as a prediction: the one place that says what an evaluation scores of a decision.

``fastslow eval`` turns the router's decisions into predictions, ``fastslow tune --from-log`` and
``fastslow report drift`` turn the decisions read back from the log into them: the same
``prediction`` serves both, so *answer*, *kept* and *error* mean the same wherever they are counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastslow.router import Verdict

from ._predictions import Kind, Prediction

__all__ = ["FAILED_REASONS", "Decided", "prediction"]

FAILED_REASONS = frozenset({"engine_error", "timeout", "no_answer"})
"""The reasons of a decision System 1 could not make: its prediction carries the error."""


class Decided(Protocol):
    """What a prediction is made of: a ``fastslow.router.Decision``, or one the decision log kept."""

    @property
    def outcome(self) -> str | None: ...
    @property
    def system(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def escalate(self) -> bool: ...
    @property
    def threshold(self) -> float: ...
    @property
    def probabilities(self) -> Mapping[str, float]: ...
    @property
    def verdict(self) -> Verdict | None: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def detail(self) -> str: ...


def top_option(probabilities: Mapping[str, float]) -> str | None:
    """The most probable option (the first of a tie); ``None`` for an empty distribution."""
    return max(probabilities, key=probabilities.__getitem__) if probabilities else None


def prediction(
    decision: Decided,
    *,
    row: str,
    question: str,
    kind: Kind,
    options: tuple[str, ...],
    label: str | None,
    weight: float = 1.0,
    split: str | None = None,
    task: str | None = None,
    none_option: str | None = None,
    violation: str | None = None,
    check: bool = False,
    meta: Mapping[str, Any] | None = None,
) -> Prediction:
    """The prediction ``decision`` makes for ``question`` of ``row``, scored against ``label``.

    The answer is System 1's most probable option. *Kept*: System 1 gave a distribution and the
    decision stayed with it. A check the router could not settle (System 1 failed, no System 2) is
    denied by system 1 without escalating, so the distribution is what tells a kept verdict from a
    fail-closed one. With ``check``, the outcome is the verdict (``None`` when nobody judged it: it
    failed closed); otherwise it is the decision's outcome.
    """
    probabilities = dict(decision.probabilities)
    answer = top_option(probabilities)
    kept = decision.system == 1 and not decision.escalate and answer is not None
    outcome: str | None
    if check:
        outcome = decision.verdict if kept or decision.system == 2 else None
    else:
        outcome = decision.outcome
    return Prediction(
        row=row,
        question=question,
        kind=kind,
        options=options,
        label=label,
        answer=answer,
        probabilities=probabilities,
        confidence=probabilities[answer] if answer is not None else 0.0,
        kept=kept,
        reason=decision.reason,
        outcome=outcome,
        system=1 if decision.system == 1 else 2,
        latency_ms=decision.latency_ms,
        threshold=decision.threshold,
        weight=weight,
        split=split,
        task=task,
        none_option=none_option,
        verdict=decision.verdict if check else None,
        violation=violation,
        meta=dict(meta) if meta is not None else {},
        error=(decision.detail or decision.reason) if decision.reason in FAILED_REASONS else None,
    )
