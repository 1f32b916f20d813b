"""trust: the store's identity, idempotent submissions, launch retries for the scheduler's faults

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    identity = op.create_table(
        "store_identity",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("legacy_below", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    # Jobs made before this revision keep their folders `jobs/<id>`; newer ones are
    # `jobs/<store id>-<id>`, unique to the store that made them.
    newest = op.get_bind().execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM jobs")).scalar_one()
    op.bulk_insert(identity, [{"id": uuid.uuid4().hex, "created_at": time.time(), "legacy_below": int(newest) + 1}])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("launch_failures", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("retry_after", sa.Float(), nullable=True))
        batch.add_column(sa.Column("launch_error", sa.String(length=500), nullable=True))
        batch.create_index("ux_jobs_idempotency", ["team", "idempotency_key"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ux_jobs_idempotency")
        batch.drop_column("launch_error")
        batch.drop_column("retry_after")
        batch.drop_column("launch_failures")
        batch.drop_column("idempotency_key")
    op.drop_table("store_identity")
