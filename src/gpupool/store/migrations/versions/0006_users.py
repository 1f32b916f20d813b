"""users: who submits, inside a team, each with a token of their own; GPUs held for a preemptor

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.create_index("ix_jobs_user", ["user"], unique=False)
        batch.add_column(sa.Column("held_gpus", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("held_gpus")
        batch.drop_index("ix_jobs_user")
    op.drop_table("users")
