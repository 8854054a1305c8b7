"""The audit sample: which decisions were drawn for labelling, and at what rate.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite cannot add a NOT NULL column with a default to a table in place.
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("audit", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("audit_rate", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("audit_rate")
        batch.drop_column("audit")
