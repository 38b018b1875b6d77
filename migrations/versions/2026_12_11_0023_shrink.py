"""Shrinking elastic gangs to make room: the size a job was asked to shrink to

Revision ID: 0023_shrink
Revises: 0022_app_role
Create Date: 2026-12-11 12:00:00

- `jobs.shrink_to`: set by a dispatcher that makes room for a waiting job by shrinking this running
  elastic gang instead of preempting it (api/dispatcher/preemption.py); the job's scaling policy reads
  it through `GET /v1/jobs/{id}/control` and keeps the gang at most that size for the rest of the
  attempt. NULL: no cap. `preempted_by` names the job it shrinks for, and `shrink_requested_at` when:
  for `preemption_grace_s` from then the waiting job counts on what the shrink frees (Ray releases the
  old group's resources a moment after the new group started) instead of asking anyone else.

Catalogue change only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023_shrink"
down_revision: str | None = "0022_app_role"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("jobs", sa.Column("shrink_to", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("shrink_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "shrink_requested_at")
    op.drop_column("jobs", "shrink_to")
