"""Learning from escalations: the learned examples, and the version each decision was made with.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("examples_version", sa.String(40), nullable=True))
    op.create_table(
        "learned_examples",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("question", sa.String(), nullable=False),
        sa.Column("option", sa.String(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("text_hash", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=True),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retracted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retracted_why", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name="fk_learned_examples_decision_id_decisions",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_learned_examples"),
        sa.UniqueConstraint("task", "question", "text_hash", name="uq_learned_examples_task_question_text_hash"),
    )
    op.create_index("ix_learned_examples_decision_id", "learned_examples", ["decision_id"])
    op.create_index("ix_learned_examples_task_retracted_at", "learned_examples", ["task", "retracted_at"])


def downgrade() -> None:
    op.drop_table("learned_examples")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("examples_version")
