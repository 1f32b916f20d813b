"""holds, removals and webhooks: a pending job held by a person (`gpupool hold`) waits until released;
who held it (`user` or `admin`) says who may release it. The change journal's trigger on jobs
takes the new column, so that a hold and a release reach the control loop's next read. A team
removed (`team remove`) is marked, not deleted: its ended jobs still name it. A job may name a
URL to tell of its start, end and notices (`submit --notify`).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# 0011's columns of jobs whose update is a change (migrations stay frozen: written out again).
JOB_COLUMNS = (
    "state, team, priority, gpus, submit_time, gpus_per_node, gpu_type, preemptions, max_preemptions, "
    "nominated_at, dependencies, dependency_met_at, array_id, array_index, array_limit, retry_after, "
    "launch_error, launch_failures"
)


def _update_trigger(columns: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS changes_jobs_update")
        op.execute(
            f"CREATE TRIGGER changes_jobs_update AFTER UPDATE OF {columns} ON jobs FOR EACH ROW "
            "BEGIN INSERT INTO changes (job_id) VALUES (NEW.id); END"
        )
    else:
        op.execute("DROP TRIGGER IF EXISTS changes_jobs_update ON jobs")
        op.execute(
            f"CREATE TRIGGER changes_jobs_update AFTER UPDATE OF {columns} ON jobs "
            "FOR EACH ROW EXECUTE FUNCTION gpupool_changed_jobs()"
        )


def upgrade() -> None:
    op.add_column("jobs", sa.Column("held_by", sa.String(20), nullable=True))
    op.add_column("teams", sa.Column("removed_at", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("notify", sa.String(2000), nullable=True))
    _update_trigger(f"{JOB_COLUMNS}, held_by")


def downgrade() -> None:
    _update_trigger(JOB_COLUMNS)  # first: a trigger naming the column would keep it
    op.drop_column("jobs", "held_by")
    op.drop_column("teams", "removed_at")
    op.drop_column("jobs", "notify")
