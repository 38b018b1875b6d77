"""job_events.count and job_events.last_at: an event repeated right after itself is counted, not stored again

Revision ID: 0012_job_event_repeats
Revises: 0011_sweeps_served_at
Create Date: 2026-12-07 10:00:00

A job that reports the same event over and over (a retried warning, a reason given every round) grew
its events without bound. `api.jobs.status.record_event` now counts an event identical to the job's
latest one (kind, message and data) on that row: `count` (1 for every existing row) and `last_at`, when
it last happened. Online: a NOT NULL column with a constant default and a nullable one are catalogue
changes only (no table rewrite).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_job_event_repeats"
down_revision: str | None = "0011_sweeps_served_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("job_events", sa.Column("count", sa.Integer(), server_default=sa.text("1"), nullable=False))
    op.add_column("job_events", sa.Column("last_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.drop_column("job_events", "last_at")
    op.drop_column("job_events", "count")
