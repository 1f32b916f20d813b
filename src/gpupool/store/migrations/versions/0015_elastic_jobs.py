"""elastic jobs: a job's sizes, the size each attempt ran at, what a resize's notice keeps,
and the free GPUs a growth holds for the attempt that follows

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

COLUMNS: dict[str, dict[str, Any]] = {
    "jobs": {"sizes": sa.JSON()},
    "attempts": {"gpus": sa.Integer(), "notice_keep": sa.JSON()},
    "placements": {"added": sa.Boolean()},
}


def upgrade() -> None:
    # Plain ALTER TABLE (no table copied): the change journal's triggers stay.
    for table, columns in COLUMNS.items():
        for name, kind in columns.items():
            op.add_column(table, sa.Column(name, kind, nullable=True))
    # Every attempt before this one ran at its job's one size.
    op.execute("UPDATE attempts SET gpus = (SELECT jobs.gpus FROM jobs WHERE jobs.id = attempts.job_id)")


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        for name in columns:
            op.drop_column(table, name)
