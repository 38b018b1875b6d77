"""Bounded waits: when a queued job was first passed by a later job of its own project

Revision ID: 0024_bypassed
Revises: 0023_shrink
Create Date: 2026-12-12 12:00:00

- `jobs.bypassed_since`: set by an admission round in which the job waited for resources while a job
  after it in its project's admission order was admitted (a smaller gang fitted where it did not);
  cleared when it starts. Once it is older than the `starvation_s` setting, the job holds admission:
  nothing after it is admitted until it fits (api/dispatcher/decide.py), so a large gang is not passed
  by smaller ones forever.

Catalogue change only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024_bypassed"
down_revision: str | None = "0023_shrink"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("jobs", sa.Column("bypassed_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "bypassed_since")
