"""the store holds team policy: what the file last seeded, attempts' classes, nominated jobs

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("seeded", sa.JSON(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("priority", sa.String(length=100), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("nominated_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("nominated_at")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("priority")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("seeded")
