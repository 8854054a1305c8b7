"""Review queue (reviews, review_events), API key scopes, hourly rollups and the console's indexes
(outcomes gain their decision's tenant and task, filled in here for the rows already kept).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06

The rollups are filled from the decisions already logged, a chunk at a time, so an existing log's
overview covers its past too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BACKFILL_CHUNK = 20_000


def _backfill() -> None:
    from fastslow.api.store._rollup import rollups_of

    bind = op.get_bind()
    decisions = sa.table(
        "decisions",
        *(
            sa.column(name)
            for name in ("id", "tenant", "task", "engine", "system", "reason", "escalate", "verdict", "policy_version")
        ),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("cost_usd", sa.Double()),
        sa.column("latency_ms", sa.Double()),
    )
    rollups: dict[tuple[Any, ...], dict[str, Any]] = {}
    latency: dict[tuple[Any, ...], dict[str, Any]] = {}
    last: str | None = None
    while True:
        query = sa.select(decisions).order_by(decisions.c.id).limit(_BACKFILL_CHUNK)
        if last is not None:
            query = query.where(decisions.c.id > last)
        rows = [dict(row._mapping) for row in bind.execute(query)]
        if not rows:
            break
        last = rows[-1]["id"]
        ups, buckets = rollups_of(rows)
        for up in ups:
            key = tuple(
                up[k] for k in ("tenant", "task", "hour", "engine", "system", "reason", "kept", "policy_version")
            )
            into = rollups.setdefault(key, {**up, "decisions": 0, "cost_usd": 0.0, "costed": 0, "latency_ms": 0.0})
            for name in ("decisions", "cost_usd", "costed", "latency_ms"):
                into[name] += up[name]
        for b in buckets:
            key = tuple(b[k] for k in ("tenant", "task", "hour", "engine", "bucket"))
            latency.setdefault(key, {**b, "decisions": 0})["decisions"] += b["decisions"]
    if rollups:
        op.bulk_insert(_rollups_table(), list(rollups.values()))
        op.bulk_insert(_latency_table(), list(latency.values()))


def _rollups_table() -> sa.TableClause:
    return sa.table(
        "decision_rollups",
        *(sa.column(n) for n in ("tenant", "task", "engine", "system", "reason", "kept", "policy_version")),
        sa.column("hour", sa.DateTime(timezone=True)),
        *(sa.column(n) for n in ("decisions", "cost_usd", "costed", "latency_ms")),
    )


def _latency_table() -> sa.TableClause:
    return sa.table(
        "latency_rollups",
        *(sa.column(n) for n in ("tenant", "task", "engine", "bucket", "decisions")),
        sa.column("hour", sa.DateTime(timezone=True)),
    )


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("scopes", sa.String(64), nullable=False, server_default="check,read"))
    op.create_index("ix_decisions_tenant_created_at_id", "decisions", ["tenant", "created_at", "id"])
    op.create_index("ix_decisions_tenant_task_created_at_id", "decisions", ["tenant", "task", "created_at", "id"])
    op.create_index(
        "ix_decisions_audit_tenant_created_at_id",
        "decisions",
        ["tenant", "created_at", "id"],
        sqlite_where=sa.text("audit"),
        postgresql_where=sa.text("audit"),
    )
    with op.batch_alter_table("outcomes") as batch:
        batch.add_column(sa.Column("tenant", sa.String(), nullable=True))
        batch.add_column(sa.Column("task", sa.String(), nullable=True))
    op.execute(
        "UPDATE outcomes SET"
        " tenant = (SELECT decisions.tenant FROM decisions WHERE decisions.id = outcomes.decision_id),"
        " task = (SELECT decisions.task FROM decisions WHERE decisions.id = outcomes.decision_id)"
    )
    op.create_index("ix_outcomes_tenant_task_created_at", "outcomes", ["tenant", "task", "created_at"])
    op.create_table(
        "reviews",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("thread_id", sa.String(), nullable=True),
        sa.Column("tool_call_id", sa.String(), nullable=True),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("rule", sa.String(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("probabilities", sa.Text(), nullable=False),
        sa.Column("probability", sa.Double(), nullable=False),
        sa.Column("uncertainty", sa.Double(), nullable=False),
        sa.Column("policy_version", sa.String(), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("verdict", sa.String(10), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("settled_by", sa.String(64), nullable=True),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reviews"),
    )
    op.create_index("ix_reviews_decision_id", "reviews", ["decision_id"])
    op.create_index("ix_reviews_tenant_status_uncertainty", "reviews", ["tenant", "status", "uncertainty"])
    op.create_index("ix_reviews_status_expires_at", "reviews", ["status", "expires_at"])
    op.create_table(
        "review_events",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("review_id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(20), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_review_events"),
    )
    op.create_index("ix_review_events_review_id", "review_events", ["review_id"])
    op.create_index(
        "ix_review_events_delivered_at_next_attempt_at", "review_events", ["delivered_at", "next_attempt_at"]
    )
    op.create_table(
        "decision_rollups",
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("system", sa.SmallInteger(), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("kept", sa.Boolean(), nullable=False),
        sa.Column("policy_version", sa.String(), nullable=False),
        sa.Column("decisions", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Double(), nullable=False),
        sa.Column("costed", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant", "task", "hour", "engine", "system", "reason", "kept", "policy_version", name="pk_decision_rollups"
        ),
    )
    op.create_table(
        "latency_rollups",
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.Column("decisions", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "task", "hour", "engine", "bucket", name="pk_latency_rollups"),
    )
    _backfill()


def downgrade() -> None:
    op.drop_table("latency_rollups")
    op.drop_table("decision_rollups")
    op.drop_table("review_events")
    op.drop_table("reviews")
    op.drop_index("ix_outcomes_tenant_task_created_at", table_name="outcomes")
    with op.batch_alter_table("outcomes") as batch:
        batch.drop_column("task")
        batch.drop_column("tenant")
    op.drop_index("ix_decisions_audit_tenant_created_at_id", table_name="decisions")
    op.drop_index("ix_decisions_tenant_task_created_at_id", table_name="decisions")
    op.drop_index("ix_decisions_tenant_created_at_id", table_name="decisions")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("scopes")
