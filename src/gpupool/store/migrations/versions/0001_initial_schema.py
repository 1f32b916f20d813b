"""initial schema

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=40), nullable=True),
        sa.Column("message", sa.String(length=2000), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_job", ["job_id"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=100), nullable=False),
        sa.Column("virtual", sa.Boolean(), nullable=False),
        sa.Column("team", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "priority_classes",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("may_preempt", sa.Boolean(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("min_runtime", sa.Float(), nullable=False),
        sa.Column("grace_period", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("value"),
    )
    op.create_table(
        "teams",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("guaranteed_gpus", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=True),
        sa.Column("allowed_classes", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "budgets",
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("priority", sa.String(length=100), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("window", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["priority"],
            ["priority_classes.name"],
        ),
        sa.ForeignKeyConstraint(["team"], ["teams.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("team", "priority"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("priority", sa.String(length=100), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=True),
        sa.Column("gpu_type", sa.String(length=100), nullable=True),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("workdir", sa.String(length=4096), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("submit_time", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("max_failures", sa.Integer(), nullable=False),
        sa.Column("max_preemptions", sa.Integer(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("cancel_requested_at", sa.Float(), nullable=True),
        sa.Column("wait_reason", sa.String(length=40), nullable=True),
        sa.Column("wait_message", sa.String(length=2000), nullable=True),
        sa.ForeignKeyConstraint(
            ["priority"],
            ["priority_classes.name"],
        ),
        sa.ForeignKeyConstraint(
            ["team"],
            ["teams.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_state", ["state"], unique=False)
        batch_op.create_index("ix_jobs_team_state", ["team", "state"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_started", sa.String(length=64), nullable=True),
        sa.Column("token_hash", sa.String(length=128), nullable=True),
        sa.Column("last_heartbeat_at", sa.Float(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("phase", sa.String(length=20), nullable=True),
        sa.Column("productive_at", sa.Float(), nullable=True),
        sa.Column("last_checkpoint_at", sa.Float(), nullable=True),
        sa.Column("notice_at", sa.Float(), nullable=True),
        sa.Column("notice_deadline", sa.Float(), nullable=True),
        sa.Column("notice_for", sa.Integer(), nullable=True),
        sa.Column("acked_at", sa.Float(), nullable=True),
        sa.Column("completed_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "attempt"),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index("ix_attempts_live", ["ended_at"], unique=False)

    op.create_table(
        "checkpoint_commits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("path", sa.String(length=4096), nullable=True),
        sa.ForeignKeyConstraint(["job_id", "attempt"], ["attempts.job_id", "attempts.attempt"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("checkpoint_commits", schema=None) as batch_op:
        batch_op.create_index("ix_checkpoints_job", ["job_id"], unique=False)

    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=200), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("held_from", sa.Float(), nullable=False),
        sa.Column("held_until", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id", "attempt"], ["attempts.job_id", "attempts.attempt"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["node"],
            ["nodes.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.create_index("ix_placements_attempt", ["job_id", "attempt"], unique=False)
        batch_op.create_index(
            "ux_placements_live_gpu",
            ["node", "gpu"],
            unique=True,
            sqlite_where=sa.text("held_until IS NULL"),
            postgresql_where=sa.text("held_until IS NULL"),
        )


def downgrade() -> None:
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.drop_index(
            "ux_placements_live_gpu",
            sqlite_where=sa.text("held_until IS NULL"),
            postgresql_where=sa.text("held_until IS NULL"),
        )
        batch_op.drop_index("ix_placements_attempt")

    op.drop_table("placements")
    with op.batch_alter_table("checkpoint_commits", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoints_job")

    op.drop_table("checkpoint_commits")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_live")

    op.drop_table("attempts")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_team_state")
        batch_op.drop_index("ix_jobs_state")

    op.drop_table("jobs")
    op.drop_table("budgets")
    op.drop_table("teams")
    op.drop_table("priority_classes")
    op.drop_table("nodes")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_job")

    op.drop_table("events")
