"""Checkpoint sizes measured by the platform, not taken from the job

Revision ID: 0028_measured_sizes
Revises: 0027_token_parent
Create Date: 2026-12-16 09:00:00

A job reports each checkpoint's size, and storage quotas counted that figure: a job could report 1 byte
for a checkpoint of a terabyte. Now the dispatcher measures each live checkpoint on local storage
(api/dispatcher/checkpoint_sizes.py) and stores what it found in `checkpoints.size_bytes`, which 0019's triggers
count; the job's figure is a hint until then.

- `checkpoints.size_measured_at`: when the platform last measured the checkpoint (NULL: never; its
  `size_bytes` is the job's figure).
- `ix_checkpoints_measured`: live checkpoints by that time, for the measuring pass (the unmeasured first,
  then those measured longest ago). Built CONCURRENTLY: writes to checkpoints go on meanwhile. If the
  upgrade stops in the build, drop the index (it may be left invalid) and upgrade again.

Existing checkpoints start unmeasured, and are measured a bounded number per pass.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028_measured_sizes"
down_revision: str | None = "0027_token_parent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("checkpoints", sa.Column("size_measured_at", sa.DateTime(timezone=True), nullable=True))
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_checkpoints_measured"
            " ON checkpoints (size_measured_at, id) WHERE deleted_at IS NULL"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_checkpoints_measured")
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.drop_column("checkpoints", "size_measured_at")
