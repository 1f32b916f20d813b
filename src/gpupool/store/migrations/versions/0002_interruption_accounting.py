"""interruption accounting: what an attempt restored, and how long saves blocked

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("restored_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("restore_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("since_commit", sa.Float(), nullable=True))
    with op.batch_alter_table("checkpoint_commits") as batch:
        batch.add_column(sa.Column("seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_commits") as batch:
        batch.drop_column("seconds")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("since_commit")
        batch.drop_column("restore_seconds")
        batch.drop_column("restored_step")
