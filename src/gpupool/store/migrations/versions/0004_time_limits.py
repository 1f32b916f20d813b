"""time limits: a job's limit and run time so far, and when an attempt reached the limit

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("time_limit", sa.Float(), nullable=True))
        batch.add_column(sa.Column("run_seconds", sa.Float(), nullable=False, server_default="0"))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("timeout_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("timeout_at")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("run_seconds")
        batch.drop_column("time_limit")
