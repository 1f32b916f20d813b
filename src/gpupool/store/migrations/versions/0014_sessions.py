"""sessions: what kind of session a job is (run, shell, notebook), a cancel that kills at once,
each attempt's idle time and notebook server, and a class's default time limit and idle reclaim

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COLUMNS: dict[str, dict[str, Any]] = {
    "jobs": {"session": sa.String(20), "kill_requested_at": sa.Float()},
    "attempts": {"idle_seconds": sa.Float(), "server": sa.JSON()},
    "priority_classes": {"time_limit": sa.Float(), "idle_after": sa.Float(), "on_idle": sa.String(20)},
}


def upgrade() -> None:
    # Plain ALTER TABLE (no table copied): the change journal's triggers on jobs stay.
    for table, columns in COLUMNS.items():
        for name, kind in columns.items():
            op.add_column(table, sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for table, columns in COLUMNS.items():
        for name in columns:
            op.drop_column(table, name)
