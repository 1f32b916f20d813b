"""containment: what a job asks besides GPUs (--mem, --mem-per-gpu, --cpus-per-gpu), and what
each attempt used (peak memory, CPU time, kills for memory, peak GPU memory)

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

JOB_COLUMNS = {"mem": sa.BigInteger, "mem_per_gpu": sa.BigInteger, "cpus_per_gpu": sa.Float}
ATTEMPT_COLUMNS = {
    "peak_memory": sa.BigInteger,
    "cpu_seconds": sa.Float,
    "oom_kills": sa.Integer,
    "peak_gpu_memory": sa.BigInteger,
}


def upgrade() -> None:
    # Plain ALTER TABLE (no table copied): the change journal's triggers on jobs stay.
    for name, kind in JOB_COLUMNS.items():
        op.add_column("jobs", sa.Column(name, kind(), nullable=True))
    for name, kind in ATTEMPT_COLUMNS.items():
        op.add_column("attempts", sa.Column(name, kind(), nullable=True))


def downgrade() -> None:
    for name in ATTEMPT_COLUMNS:
        op.drop_column("attempts", name)
    for name in JOB_COLUMNS:
        op.drop_column("jobs", name)
