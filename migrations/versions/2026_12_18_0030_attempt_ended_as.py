"""How an attempt ended, as a code: the requeue limits count attempts by it, not by their error text

Revision ID: 0030_attempt_ended_as
Revises: 0029_share_from_tm_share
Create Date: 2026-12-18 09:00:00

- `job_attempts.ended_as`: why an attempt that was not the job's failure ended (`unplaced`,
  `driver_crashed`, `preempted`; api/dispatcher/ending.py, AttemptEnd), NULL otherwise. The dispatcher
  counts an attempt's kind by it; before, it matched the start of the attempt's error text.

Attempts that ended so before the upgrade are marked from the error text the dispatcher wrote for them,
once, here. A column without a default: adding it rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030_attempt_ended_as"
down_revision: str | None = "0029_share_from_tm_share"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The error text each kind of end began with in the releases before this one.
EARLIER_ERRORS = {
    "unplaced": "gang not placed by Ray%",
    "driver_crashed": "the job''s driver crashed%",
    "preempted": "preempted by %",
}


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("job_attempts", sa.Column("ended_as", sa.Text(), nullable=True))
    for kind, start in EARLIER_ERRORS.items():
        op.execute(f"UPDATE job_attempts SET ended_as = '{kind}' WHERE error LIKE '{start}' AND ended_as IS NULL")


def downgrade() -> None:
    op.drop_column("job_attempts", "ended_as")
