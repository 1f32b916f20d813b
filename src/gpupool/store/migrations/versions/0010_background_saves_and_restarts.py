"""background saves and restarts: how long a checkpoint was written after training went on;
where an attempt's start-up went, phase by phase

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoint_commits", sa.Column("background_seconds", sa.Float(), nullable=True))
    op.add_column("attempts", sa.Column("restart", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_commits") as batch:
        batch.drop_column("background_seconds")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("restart")
