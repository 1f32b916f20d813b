"""change journal: every write to what the scheduling core reads leaves the job's id (or, for
the nodes, a mark with no job) in `changes`, by trigger, so that the control loop reads what
changed since its last decision instead of the whole store; partial indexes for what it
checks at every tick

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# What the core reads of each table (`store/scheduling.py`): an update of another column (a
# heartbeat, a wait's words) leaves no change.
JOB_COLUMNS = (
    "state, team, priority, gpus, submit_time, gpus_per_node, gpu_type, preemptions, max_preemptions, "
    "nominated_at, dependencies, dependency_met_at, array_id, array_index, array_limit, retry_after, "
    "launch_error, launch_failures"
)
ATTEMPT_COLUMNS = (
    "started_at, priority, productive_at, last_checkpoint_at, notice_at, notice_deadline, notice_for, "
    "timeout_at, ended_at, outcome"
)
# (table, the columns an update of which is a change, the job it is of: a column, or NULL for the pool)
JOURNALED = [
    ("jobs", JOB_COLUMNS, "id"),
    ("attempts", ATTEMPT_COLUMNS, "job_id"),
    ("placements", "held_until", "job_id"),
    ("nodes", "gpus, gpu_type, team, up", None),
]
PARTIAL_INDEXES = [
    (
        "ix_jobs_dependencies_unmet",
        "jobs",
        "state = 'pending' AND dependencies IS NOT NULL AND dependency_met_at IS NULL",
    ),
    ("ix_attempts_notice_live", "attempts", "ended_at IS NULL AND notice_deadline IS NOT NULL"),
    (
        "ix_jobs_watched_live",
        "jobs",
        "state IN ('starting', 'running', 'preempting') "
        "AND (time_limit IS NOT NULL OR cancel_requested_at IS NOT NULL)",
    ),
]


def _sqlite_triggers() -> list[str]:
    statements = []
    for table, columns, job in JOURNALED:
        for event, row in (("INSERT", "NEW"), (f"UPDATE OF {columns}", "NEW"), ("DELETE", "OLD")):
            value = f"{row}.{job}" if job is not None else "NULL"
            name = f"changes_{table}_{event.split()[0].lower()}"
            statements.append(
                f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW "
                f"BEGIN INSERT INTO changes (job_id) VALUES ({value}); END"
            )
    return statements


def _postgresql_triggers() -> list[str]:
    statements = []
    for table, columns, job in JOURNALED:
        value = f"CASE WHEN TG_OP = 'DELETE' THEN OLD.{job} ELSE NEW.{job} END" if job is not None else "NULL"
        statements.append(
            f"CREATE FUNCTION gpupool_changed_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"INSERT INTO changes (job_id, xid) VALUES ({value}, pg_current_xact_id()::text::bigint); "
            "RETURN NULL; END $$"
        )
        for event in ("INSERT OR DELETE", f"UPDATE OF {columns}"):
            name = f"changes_{table}_{event.split()[0].lower()}"
            statements.append(
                f"CREATE TRIGGER {name} AFTER {event} ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION gpupool_changed_{table}()"
            )
    return statements


def upgrade() -> None:
    op.create_table(
        "changes",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("xid", sa.BigInteger(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_changes_xid", "changes", ["xid"])
    dialect = op.get_bind().dialect.name
    for statement in _sqlite_triggers() if dialect == "sqlite" else _postgresql_triggers():
        op.execute(statement)
    for name, table, condition in PARTIAL_INDEXES:
        column = "job_id" if table == "attempts" else "id"
        op.create_index(name, table, [column], sqlite_where=sa.text(condition), postgresql_where=sa.text(condition))


def downgrade() -> None:
    for name, table, _ in PARTIAL_INDEXES:
        op.drop_index(name, table_name=table)
    dialect = op.get_bind().dialect.name
    for table, _, _ in JOURNALED:
        for event in ("insert", "update", "delete"):
            if dialect == "sqlite":
                op.execute(f"DROP TRIGGER IF EXISTS changes_{table}_{event}")
            else:
                op.execute(f"DROP TRIGGER IF EXISTS changes_{table}_{event} ON {table}")
        if dialect != "sqlite":
            op.execute(f"DROP FUNCTION IF EXISTS gpupool_changed_{table}()")
    op.drop_index("ix_changes_xid", table_name="changes")
    op.drop_table("changes")
