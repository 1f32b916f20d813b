"""background saves: how long a checkpoint was written after training went on

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


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_commits") as batch:
        batch.drop_column("background_seconds")
