"""What the decision log hands back: frozen values, detached from any database session."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from fastslow.router import Decision, Reason, System, Verdict

__all__ = [
    "DEFAULT_SCOPES",
    "SCOPES",
    "ApiKey",
    "Review",
    "ReviewStatus",
    "Scope",
    "StoredDecision",
    "StoredOutcome",
    "possible_id",
]

Scope = Literal["check", "review", "read"]
SCOPES: tuple[Scope, ...] = ("check", "review", "read")
"""What a key may do: ``check`` (decide: policy checks, routes, the gateway), ``read`` (the decision
log and the console), ``review`` (settle reviews; signs in to the console with its forms)."""
DEFAULT_SCOPES: frozenset[Scope] = frozenset({"check", "read"})
"""What every key could do before scopes existed, and what a key gets unless told otherwise."""

ReviewStatus = Literal["pending", "allowed", "denied", "expired"]

_ID = re.compile(r"[0-9a-f]{32}")
"""The shape of every decision and review id the log holds: ``uuid4().hex``."""


def possible_id(value: str) -> bool:
    """Whether ``value`` has the shape of a decision or review id (``uuid4().hex``).

    An id of another shape cannot be in the log: callers answer 404 without a query, so no
    database sees a NUL (which PostgreSQL refuses, failing the whole request) or any odd character.
    """
    return _ID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredDecision:
    """A decision as the log keeps it: every ``Decision`` field, plus who it was for and when."""

    id: str
    tenant: str
    task: str
    question: str
    outcome: str | None
    system: System
    reason: Reason
    escalate: bool
    confidence: float
    threshold: float
    probabilities: Mapping[str, float] = field(default_factory=dict)
    """The calibrated distribution, read back from the ``answers`` table (the same as ``answers``)."""
    verdict: Verdict | None
    policy_version: str
    engine: str
    model: str
    latency_ms: float
    detail: str
    """The decision's detail with any model thoughts stripped."""
    cost_usd: float | None
    created_at: datetime
    """When it was recorded (UTC)."""
    state_digest: str
    """sha256 hex of the canonical JSON of the state (sorted keys, no spaces, UTF-8)."""
    state_text: str | None
    """That canonical JSON, only when the task's policy keeps state; ``None`` otherwise."""
    answers: dict[str, float] = field(default_factory=dict)
    """The calibrated distribution System 1 gave, option -> probability; empty when it gave none."""
    audit: bool = False
    """Drawn into its task's audit sample: System 1 kept it, and it should be labelled."""
    audit_rate: float = 0.0
    """The task's audit rate when it was decided."""
    examples_version: str = ""
    """The learned examples System 1 was trained with (``Decision.examples_version``)."""

    def to_decision(self) -> Decision:
        """The router's ``Decision`` this was recorded from (thoughts, if any, stay stripped)."""
        return Decision(
            id=self.id,
            task=self.task,
            question=self.question,
            outcome=self.outcome,
            system=self.system,
            reason=self.reason,
            escalate=self.escalate,
            confidence=self.confidence,
            threshold=self.threshold,
            probabilities=dict(self.answers),
            verdict=self.verdict,
            policy_version=self.policy_version,
            engine=self.engine,
            model=self.model,
            latency_ms=self.latency_ms,
            detail=self.detail,
            cost_usd=self.cost_usd,
            audit=self.audit,
            audit_rate=self.audit_rate,
            examples_version=self.examples_version,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredOutcome:
    """What turned out to be right for one decision; a decision may collect several over time."""

    id: str
    decision_id: str
    label: str | None
    """The correct option, when someone knows it."""
    system2_correct: bool | None
    """Whether System 2's answer was right, when the decision was escalated and someone checked."""
    note: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKey:
    """An API key's record; the key itself is shown once, when it is created, and never kept."""

    id: str
    tenant: str
    name: str | None
    prefix: str
    """The key's first characters (``fs_`` and 8 more), enough to tell keys apart, not to use one."""
    created_at: datetime
    revoked_at: datetime | None
    scopes: frozenset[Scope] = DEFAULT_SCOPES

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def may(self, scope: Scope) -> bool:
        """Whether the key has ``scope``."""
        return scope in self.scopes


@dataclass(frozen=True, slots=True, kw_only=True)
class Review:
    """A ``review`` verdict: waiting for a person, or settled by one (or by its expiry)."""

    id: str
    tenant: str
    decision_id: str
    source: str
    """``api``, ``graph`` (``policy_gate_node``) or ``agent`` (the ``create_agent`` gate middleware)."""
    thread_id: str | None
    tool_call_id: str | None
    task: str
    rule: str
    subject: Mapping[str, object]
    """``{"text": ...}`` or ``{"tool_call": {"name": ..., "args": ...}}``: what was checked."""
    probabilities: Mapping[str, float]
    """Each rule's probability."""
    probability: float
    uncertainty: float
    policy_version: str
    status: ReviewStatus
    verdict: Verdict | None
    note: str | None
    settled_by: str | None
    settled_at: datetime | None
    created_at: datetime
    expires_at: datetime

    @property
    def pending(self) -> bool:
        return self.status == "pending"
