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
    # Dropped in place (SQLite 3.35+ can): copying a table that others reference would cascade.
    op.drop_column("attempts", "restart")
    op.drop_column("checkpoint_commits", "background_seconds")
