"""executor handles: an opaque handle per attempt in place of a local pid; nodes that leave

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ATTEMPTS = sa.table(
    "attempts",
    sa.column("job_id", sa.Integer),
    sa.column("attempt", sa.Integer),
    sa.column("pid", sa.Integer),
    sa.column("pid_started", sa.String),
    sa.column("handle", sa.JSON),
)
"""The columns both directions move data between."""


def set_attempt(bind: sa.Connection, job_id: int, attempt: int, **values: object) -> None:
    bind.execute(ATTEMPTS.update().where(ATTEMPTS.c.job_id == job_id, ATTEMPTS.c.attempt == attempt).values(**values))


def upgrade() -> None:
    op.add_column("attempts", sa.Column("handle", sa.JSON(), nullable=True))
    bind = op.get_bind()
    # Attempts started by the local executor before handles keep their launcher's pid and
    # start time, now in the local executor's handle.
    rows = bind.execute(sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.attempt, ATTEMPTS.c.pid, ATTEMPTS.c.pid_started))
    for job_id, attempt, pid, started in list(rows):
        if pid is not None:
            set_attempt(bind, job_id, attempt, handle={"pid": pid, "started": started or ""})
    # Dropped in place (SQLite 3.35+ can): copying a table that others reference would cascade.
    op.drop_column("attempts", "pid_started")
    op.drop_column("attempts", "pid")
    op.add_column("nodes", sa.Column("up", sa.Boolean(), nullable=False, server_default=sa.text("true")))


def downgrade() -> None:
    op.drop_column("nodes", "up")
    op.add_column("attempts", sa.Column("pid", sa.Integer(), nullable=True))
    op.add_column("attempts", sa.Column("pid_started", sa.String(length=64), nullable=True))
    bind = op.get_bind()
    for job_id, attempt, handle in list(
        bind.execute(sa.select(ATTEMPTS.c.job_id, ATTEMPTS.c.attempt, ATTEMPTS.c.handle))
    ):
        value = json.loads(handle) if isinstance(handle, str) else handle
        if isinstance(value, dict) and isinstance(value.get("pid"), int):
            set_attempt(bind, job_id, attempt, pid=value["pid"], pid_started=str(value.get("started", "")))
    op.drop_column("attempts", "handle")
