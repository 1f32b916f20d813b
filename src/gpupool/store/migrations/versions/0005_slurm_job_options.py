"""what a Slurm user asks of a job: its user, dependencies, arrays, a batch script, log paths

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS = (
    ("user", sa.String(length=200)),
    ("dependencies", sa.JSON(none_as_null=True)),
    ("dependency_met_at", sa.Float()),
    ("array_id", sa.Integer()),
    ("array_index", sa.Integer()),
    ("array_limit", sa.Integer()),
    ("script", sa.Text()),
    ("output", sa.String(length=4096)),
    ("error", sa.String(length=4096)),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))
        batch.create_index("ix_jobs_array", ["array_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array")
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
