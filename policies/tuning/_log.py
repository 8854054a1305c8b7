"""The labels read back from the decision log: which recorded outcomes count, as what, how much.

``fastslow tune --from-log``, ``calibrate --from-log``, ``report drift`` and ``report shadow`` read
the log through the small protocols here (``fastslow.api.store.DecisionStore`` satisfies them), so
this package never imports the store. An outcome is what people or System 2 recorded for a
decision (``POST /v1/decisions/{id}/outcome``); ``logged_label`` says which option it makes right
and ``sample_weight`` how much the decision counts under a ``Sample``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol, TypeAlias

from fastslow.policies.evaluation import Decided, Prediction, prediction
from fastslow.router import CheckTask, Task

__all__ = [
    "LOG_LIMIT",
    "SAMPLE_WORDS",
    "DriftLog",
    "LoggedDecision",
    "LoggedOutcome",
    "OutcomeLog",
    "Sample",
    "ShadowLog",
    "kept_by_system1",
    "logged_label",
    "logged_prediction",
    "sample_weight",
    "violation_of",
]

Sample: TypeAlias = Literal["weighted", "audit", "all"]
SAMPLE_WORDS: dict[str, str] = {
    "weighted": "the audit sample weighted by 1 / audit_rate, with the escalations and reviews",
    "audit": "the audit sample alone: decisions System 1 kept, drawn at random",
    "all": "every recorded outcome, unweighted (no audit sample: weighted towards escalations and reviews)",
}
"""Each sample in words, for the fit's record and the command's summary."""
LOG_LIMIT = 100_000
"""The most logged outcomes one fit reads."""
_VERDICT_LABELS = ("allow", "deny")


class LoggedDecision(Decided, Protocol):
    """A decision as the log keeps it (``fastslow.api.store.StoredDecision``)."""

    @property
    def id(self) -> str: ...
    @property
    def question(self) -> str: ...
    @property
    def audit(self) -> bool: ...
    @property
    def audit_rate(self) -> float: ...
    @property
    def policy_version(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def cost_usd(self) -> float | None: ...


class LoggedOutcome(Protocol):
    """What someone recorded as right for a decision (``fastslow.api.store.StoredOutcome``)."""

    @property
    def label(self) -> str | None: ...
    @property
    def system2_correct(self) -> bool | None: ...


class OutcomeLog(Protocol):
    """Reads decisions with their recorded outcomes, newest outcome first."""

    async def outcomes(
        self,
        *,
        tenant: str | None = ...,
        task: str | None = ...,
        since: datetime | None = ...,
        limit: int = ...,
    ) -> Sequence[tuple[LoggedDecision, LoggedOutcome]]: ...

    async def aclose(self) -> None: ...


class DriftLog(OutcomeLog, Protocol):
    """An ``OutcomeLog`` that also counts a task's decisions, labelled or not, and those System 1 kept."""

    async def kept_counts(
        self, *, task: str, tenant: str | None = ..., since: datetime | None = ...
    ) -> tuple[int, int]: ...


class ShadowLog(Protocol):
    """Reads a task's decisions, newest first, with their distributions."""

    async def decisions(
        self,
        *,
        task: str,
        tenant: str | None = ...,
        since: datetime | None = ...,
        reason: str | None = ...,
        limit: int = ...,
    ) -> Sequence[LoggedDecision]: ...

    async def aclose(self) -> None: ...


def kept_by_system1(decision: LoggedDecision) -> bool:
    """Whether System 1 settled it: not escalated, and not a check's review (which people settle)."""
    return decision.system == 1 and not decision.escalate and decision.verdict != "review"


def sample_weight(sample: Sample, decision: LoggedDecision) -> float | None:
    """How much a labelled decision counts under ``sample`` (``collect_from_log``); ``None``: not at all."""
    kept = kept_by_system1(decision)
    if sample == "all":
        return 1.0
    if decision.audit:
        return 1.0 / decision.audit_rate if sample == "weighted" and decision.audit_rate > 0 else 1.0
    if sample == "weighted" and not kept:
        return 1.0
    return None


def violation_of(task: Task, question: str) -> str | None:
    """The option that violates a check's rule ``question``; ``None`` for other tasks' questions."""
    if isinstance(task, CheckTask) and question in task.rules:
        return task.rules[question].action.violation
    return None


def logged_label(task: Task, question: str, decided: str | None, system: int, outcome: LoggedOutcome) -> str | None:
    """The option an outcome says was right, or ``None`` when it does not say."""
    label: str | None = outcome.label
    if label is None and outcome.system2_correct is True and system == 2:
        label = decided
    violation = violation_of(task, question)
    if violation is not None and label in _VERDICT_LABELS:
        other = [o for o in task.rules[question].question.options if o != violation]  # type: ignore[union-attr]
        return violation if label == "deny" else (other[0] if other else None)
    if violation is not None and label == "review":
        return None
    return label


def logged_prediction(decision: LoggedDecision, task: Task, *, label: str, weight: float) -> Prediction:
    """A logged decision with a distribution, as the prediction an evaluation would have made of it."""
    probabilities: Mapping[str, float] = decision.probabilities
    options = tuple(probabilities)
    return prediction(
        decision,
        row=decision.id,
        question=decision.question,
        kind="noul" if set(options) == {"yes", "no"} else "choice",
        options=options,
        label=label,
        task=task.name,
        weight=weight,
        none_option=getattr(task, "none_option", None),
        violation=violation_of(task, decision.question),
    )
