"""Topology: the node-label domain each attempt was admitted into

Revision ID: 0021_topology
Revises: 0020_fair_share
Create Date: 2026-12-10 15:00:00

- `job_attempts.selector`: for a gang with `scaling.topology`, the node label and value admission
  placed it inside (`{"rack": "r2"}`); its launch asks Ray Train to keep the workers there
  (ScalingConfig.label_selector), and a launch submitted again asks the same. NULL: anywhere.

Catalogue change only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021_topology"
down_revision: str | None = "0020_fair_share"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("job_attempts", sa.Column("selector", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("job_attempts", "selector")
