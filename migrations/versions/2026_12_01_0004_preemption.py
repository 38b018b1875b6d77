"""jobs.preempted_by and jobs.preempt_requested_at: a running job asked to make room

Revision ID: 0004_preemption
Revises: 0003_sweeps
Create Date: 2026-12-01 15:20:00

Two nullable columns with no default: PostgreSQL adds them to the catalogue only (no table rewrite,
no long lock), so the migration is safe on a busy jobs table.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_preemption"
down_revision: str | None = "0003_sweeps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("preempted_by", sa.UUID(), nullable=True))
    op.add_column("jobs", sa.Column("preempt_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "preempt_requested_at")
    op.drop_column("jobs", "preempted_by")
