"""The decision log: decisions, answers, outcomes and API keys.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("question", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=True),
        sa.Column("system", sa.SmallInteger(), nullable=False),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("escalate", sa.Boolean(), nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("threshold", sa.Double(), nullable=False),
        sa.Column("verdict", sa.String(10), nullable=True),
        sa.Column("policy_version", sa.String(), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("cost_usd", sa.Double(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("state_digest", sa.String(64), nullable=False),
        sa.Column("state_text", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
    )
    op.create_index("ix_decisions_tenant", "decisions", ["tenant"])
    op.create_index("ix_decisions_created_at", "decisions", ["created_at"])
    op.create_index("ix_decisions_tenant_task", "decisions", ["tenant", "task"])

    op.create_table(
        "answers",
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("option", sa.String(), nullable=False),
        sa.Column("probability", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name="fk_answers_decision_id_decisions", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("decision_id", "option", name="pk_answers"),
    )

    op.create_table(
        "outcomes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("system2_correct", sa.Boolean(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name="fk_outcomes_decision_id_decisions", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_outcomes"),
    )
    op.create_index("ix_outcomes_decision_id", "outcomes", ["decision_id"])
    op.create_index("ix_outcomes_created_at", "outcomes", ["created_at"])

    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=True),
        sa.Column("prefix", sa.String(20), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant", "api_keys", ["tenant"])


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_table("outcomes")
    op.drop_table("answers")
    op.drop_table("decisions")
