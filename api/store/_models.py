"""The decision log's tables as SQLAlchemy 2.0 typed models.

These models describe the schema the migrations in ``migrations/versions`` build; a test compares
the two, so a change here without a migration fails. Thoughts have no column anywhere: the
``Decision`` type carries none, and ``detail`` is passed through ``strip_thoughts`` before it is
stored.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "AnswerRow",
    "ApiKeyRow",
    "Base",
    "DecisionRow",
    "IdempotencyKeyRow",
    "LatencyRollupRow",
    "LearnedExampleRow",
    "OutcomeRow",
    "RateWindowRow",
    "ReviewEventRow",
    "ReviewRow",
    "RollupRow",
    "UTCDateTime",
]

# Named constraints, so that later migrations can alter them by name on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC ``datetime`` on every backend.

    PostgreSQL keeps ``timestamptz``; SQLite keeps text without an offset, so values are stored as
    UTC and read back with ``tzinfo=UTC`` attached.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:  # noqa: ARG002
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class DecisionRow(Base):
    """One decision, as the router made it, for one tenant."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_tenant_task", "tenant", "task"),
        # The console's pages walk these newest first and stop at a page: never a scan of the log.
        Index("ix_decisions_tenant_created_at_id", "tenant", "created_at", "id"),
        Index("ix_decisions_tenant_task_created_at_id", "tenant", "task", "created_at", "id"),
        # The audit sample is a sliver of the log: its own partial index, so a page of it never walks the rest.
        Index(
            "ix_decisions_audit_tenant_created_at_id",
            "tenant",
            "created_at",
            "id",
            sqlite_where=text("audit"),
            postgresql_where=text("audit"),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String, index=True)
    task: Mapped[str] = mapped_column(String)
    question: Mapped[str] = mapped_column(String)
    outcome: Mapped[str | None] = mapped_column(String)
    system: Mapped[int] = mapped_column(SmallInteger)
    reason: Mapped[str] = mapped_column(String(40))
    escalate: Mapped[bool] = mapped_column(Boolean)
    confidence: Mapped[float] = mapped_column(Double)
    threshold: Mapped[float] = mapped_column(Double)
    verdict: Mapped[str | None] = mapped_column(String(10))
    policy_version: Mapped[str] = mapped_column(String)
    engine: Mapped[str] = mapped_column(String)
    model: Mapped[str] = mapped_column(String)
    latency_ms: Mapped[float] = mapped_column(Double)
    cost_usd: Mapped[float | None] = mapped_column(Double)
    detail: Mapped[str] = mapped_column(Text)
    state_digest: Mapped[str] = mapped_column(String(64))
    """sha256 hex of the canonical JSON of the state."""
    state_text: Mapped[str | None] = mapped_column(Text)
    """The canonical JSON of the state, only when the task's policy says to keep it."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    audit: Mapped[bool] = mapped_column(Boolean, server_default=false(), default=False)
    """Drawn into its task's audit sample (``Decision.audit``)."""
    audit_rate: Mapped[float | None] = mapped_column(Double)
    """The task's audit rate when it was decided: an audited outcome weighs ``1 / audit_rate``."""
    examples_version: Mapped[str | None] = mapped_column(String(40))
    """The learned examples System 1 was trained with for the task (``Decision.examples_version``)."""


class AnswerRow(Base):
    """One option's calibrated probability in a decision's distribution."""

    __tablename__ = "answers"

    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id", ondelete="CASCADE"), primary_key=True)
    option: Mapped[str] = mapped_column(String, primary_key=True)
    probability: Mapped[float] = mapped_column(Double)


class OutcomeRow(Base):
    """What turned out to be right for a decision (a label, or whether System 2 was right)."""

    __tablename__ = "outcomes"
    # Calibration reads a task's newest outcomes: walked from this index, never from the decisions.
    __table_args__ = (Index("ix_outcomes_tenant_task_created_at", "tenant", "task", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str | None] = mapped_column(String)
    """The decision's tenant and task, copied when the outcome is recorded (filled in for older rows by 0006)."""
    task: Mapped[str | None] = mapped_column(String)
    label: Mapped[str | None] = mapped_column(String)
    system2_correct: Mapped[bool | None] = mapped_column(Boolean)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class ApiKeyRow(Base):
    """An API key: only its sha256 and a short display prefix are kept, never the key."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String, index=True)
    name: Mapped[str | None] = mapped_column(String)
    prefix: Mapped[str] = mapped_column(String(20))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    scopes: Mapped[str] = mapped_column(String(64), server_default="check,read", default="check,read")
    """What the key may do, comma-separated: ``check``, ``review``, ``read`` (``fastslow.api.store.SCOPES``)."""


class RateWindowRow(Base):
    """Requests one API key made in one fixed window: the API's rate-limit counters.

    A cache of counters, not records: a key's older windows are deleted when it opens a new one.
    """

    __tablename__ = "fastslow_rate_windows"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hits: Mapped[int] = mapped_column(Integer, nullable=False)


class LearnedExampleRow(Base):
    """A labelled example a task learned from an escalation or an outcome (``fastslow.api.learning``).

    One row per task, question and text (the text's sha256): a text learned again is the same row,
    relabelled or left as it is. A withdrawn example keeps its row, with when and why, so that it is
    not learned again from the same wrong answer.
    """

    __tablename__ = "learned_examples"
    __table_args__ = (
        UniqueConstraint("task", "question", "text_hash", name="uq_learned_examples_task_question_text_hash"),
        Index("ix_learned_examples_task_retracted_at", "task", "retracted_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task: Mapped[str] = mapped_column(String)
    question: Mapped[str] = mapped_column(String)
    """The question's name as engines are asked it: the task's name, or ``task.question``."""
    option: Mapped[str] = mapped_column(String)
    text: Mapped[str] = mapped_column(Text)
    text_hash: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(16))
    """``system2`` (an escalated question's answer) or ``outcome`` (a recorded label)."""
    decision_id: Mapped[str | None] = mapped_column(
        ForeignKey("decisions.id", ondelete="SET NULL"), index=True, nullable=True
    )
    tenant: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    retracted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    retracted_why: Mapped[str | None] = mapped_column(Text)


class IdempotencyKeyRow(Base):
    """A request sent with an ``Idempotency-Key`` and the response it got: what its retries are answered.

    Written in the transaction that records the request's decisions (or outcome), so a stored
    response never exists without what it reports, nor those without it. The primary key is the
    guard across replicas: one ``(tenant, endpoint, key)`` commits, a second is refused.
    """

    __tablename__ = "idempotency_keys"

    tenant: Mapped[str] = mapped_column(String, primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    """sha256 hex of the request's canonical JSON: a retry must ask the same."""
    status: Mapped[int] = mapped_column(SmallInteger)
    body: Mapped[str] = mapped_column(Text)
    """The response's JSON, as the first request was answered."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    """After it the key is forgotten: a request with it is new, and ``fastslow db prune`` deletes the row."""


class ReviewRow(Base):
    """A ``review`` verdict waiting for a person, or how a person (or its expiry) settled it.

    ``decision_id`` is not a foreign key: a graph's gate opens its review while the decision it is
    about may still be queued in a write-behind sink. Retention deletes reviews with their decision.
    """

    __tablename__ = "reviews"
    __table_args__ = (
        # The queue: a tenant's pending reviews, most uncertain first.
        Index("ix_reviews_tenant_status_uncertainty", "tenant", "status", "uncertainty"),
        Index("ix_reviews_status_expires_at", "status", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String)
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    """The rule's decision that asked for review."""
    source: Mapped[str] = mapped_column(String(16))
    """``api`` (``POST /v1/policy-check``), ``graph`` (``policy_gate_node``) or ``agent`` (the gate middleware)."""
    thread_id: Mapped[str | None] = mapped_column(String)
    """The LangGraph thread paused at the gate (graph reviews only)."""
    tool_call_id: Mapped[str | None] = mapped_column(String)
    task: Mapped[str] = mapped_column(String)
    rule: Mapped[str] = mapped_column(String)
    subject: Mapped[str] = mapped_column(Text)
    """What was checked, as JSON: ``{"text": ...}`` or ``{"tool_call": {"name": ..., "args": ...}}``."""
    probabilities: Mapped[str] = mapped_column(Text)
    """Each rule's probability, as a JSON object ``{rule: p}``."""
    probability: Mapped[float] = mapped_column(Double)
    """The reviewed rule's probability."""
    uncertainty: Mapped[float] = mapped_column(Double)
    """``1 - |2p - 1|``: 1 at p = 0.5; the queue shows the highest first."""
    policy_version: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(10))
    """``pending``, ``allowed``, ``denied`` or ``expired``."""
    verdict: Mapped[str | None] = mapped_column(String(10))
    """``allow`` or ``deny`` once settled (an expired review takes the configured verdict)."""
    note: Mapped[str | None] = mapped_column(Text)
    settled_by: Mapped[str | None] = mapped_column(String(64))
    """The settling key's id; ``expiry`` for an expired review."""
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ReviewEventRow(Base):
    """A review opened, settled or expired, waiting to be sent to its tenant's webhook (an outbox).

    Written in the transaction that opens or settles the review, so no event is lost to a crash and
    any replica may deliver it; ``next_attempt_at`` is the claim and the back-off.
    """

    __tablename__ = "review_events"
    __table_args__ = (Index("ix_review_events_delivered_at_next_attempt_at", "delivered_at", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String)
    review_id: Mapped[str] = mapped_column(String(64), index=True)
    event: Mapped[str] = mapped_column(String(20))
    """``review.opened``, ``review.settled`` or ``review.expired``."""
    body: Mapped[str] = mapped_column(Text)
    """The JSON the webhook receives."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)


class RollupRow(Base):
    """Decisions per tenant, task and hour, kept as decisions are written: what the console's
    overview and the metrics read instead of scanning the log (``fastslow.api.store.log_summary``)."""

    __tablename__ = "decision_rollups"

    tenant: Mapped[str] = mapped_column(String, primary_key=True)
    task: Mapped[str] = mapped_column(String, primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    engine: Mapped[str] = mapped_column(String, primary_key=True)
    system: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    reason: Mapped[str] = mapped_column(String(40), primary_key=True)
    kept: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    policy_version: Mapped[str] = mapped_column(String, primary_key=True)
    decisions: Mapped[int] = mapped_column(BigInteger)
    cost_usd: Mapped[float] = mapped_column(Double)
    """Sum of the decisions' System-2 cost."""
    costed: Mapped[int] = mapped_column(BigInteger)
    """How many of them recorded a cost."""
    latency_ms: Mapped[float] = mapped_column(Double)
    """Sum of their latency."""


class LatencyRollupRow(Base):
    """Decisions per tenant, task, hour, engine and latency bucket (``_rollup.latency_bucket``)."""

    __tablename__ = "latency_rollups"

    tenant: Mapped[str] = mapped_column(String, primary_key=True)
    task: Mapped[str] = mapped_column(String, primary_key=True)
    hour: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    engine: Mapped[str] = mapped_column(String, primary_key=True)
    bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    decisions: Mapped[int] = mapped_column(BigInteger)
