"""Checkpoint lifecycle: pinned and deleted checkpoints, and a checkpoint retention per project

Revision ID: 0018_checkpoint_lifecycle
Revises: 0017_usage
Create Date: 2026-12-10 12:00:00

- `checkpoints.pinned`: kept whatever the job's policy and its project's retention say
  (`POST /v1/jobs/{id}/checkpoints/{n}/pin`).
- `checkpoints.deleted_at` and `deleted_why`: the dispatcher's checkpoint collector
  (api/dispatcher/checkpoint_collector.py) removed the checkpoint from storage; the row stays, so the API lists
  what was deleted and why.
- `projects.checkpoint_retention_days`: a finished job's unpinned checkpoints are deleted this long
  after it finished; NULL keeps them.
- `ix_checkpoints_live`: the collector reads only checkpoints that still exist.

Catalogue changes only (a column with a constant default is not a rewrite since PostgreSQL 11).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_checkpoint_lifecycle"
down_revision: str | None = "0017_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("checkpoints", sa.Column("pinned", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.add_column("checkpoints", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("checkpoints", sa.Column("deleted_why", sa.Text(), nullable=True))
    op.add_column("projects", sa.Column("checkpoint_retention_days", sa.Double(), nullable=True))
    op.create_index(
        "ix_checkpoints_live", "checkpoints", ["job_id", "id"], postgresql_where=sa.text("deleted_at IS NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoints_live", table_name="checkpoints")
    op.drop_column("projects", "checkpoint_retention_days")
    op.drop_column("checkpoints", "deleted_why")
    op.drop_column("checkpoints", "deleted_at")
    op.drop_column("checkpoints", "pinned")
