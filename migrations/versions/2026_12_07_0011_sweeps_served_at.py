"""sweeps.served_at: the controller serves running sweeps least recently served first

Revision ID: 0011_sweeps_served_at
Revises: 0010_blocks_no_sorts
Create Date: 2026-12-07 09:00:00

The controller read running sweeps oldest first, 100 a round: with more than 100 running, the newer
ones were never advanced. Each round now picks the least recently served (api/sweeps/repository.py,
sweeps_to_serve) and stamps them. A nullable column with no default: catalogue only, no rewrite.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_sweeps_served_at"
down_revision: str | None = "0010_blocks_no_sorts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sweeps", sa.Column("served_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("sweeps", "served_at")
