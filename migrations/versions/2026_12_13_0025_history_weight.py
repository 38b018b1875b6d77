"""Fair sharing's history is an average over the time it covers, not diluted by the time before it

Revision ID: 0025_history_weight
Revises: 0024_bypassed
Create Date: 2026-12-13 12:00:00

- `project_usage.history_weight`: how much of a full history the project's samples cover (1 less the
  weight that the time before its first sample would have, 0 for a new row). SAMPLE_FAIR_SHARE keeps
  `history_cpus` and `history_gpus` as the half-life average of what the project held over the time it
  covers: an exponential moving average with its start-up bias corrected. Uncorrected, a history that
  starts at 0 counts the time before the project's first job as time it held nothing, so a project that
  has held half the cluster for a day shows a quarter of it, and the projects that take most at the
  start of a day (the whole platform's, or a new project's) yield too little for it (bench/README.md,
  the fair-share simulation's figures).
- Rows there now get 1: their history is kept as it is (they have been sampled for as long as they have
  been there, and their start cannot be told now).

Catalogue change and one UPDATE of project_usage (one row per project that ever ran a job: small).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_history_weight"
down_revision: str | None = "0024_bypassed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column(
        "project_usage", sa.Column("history_weight", sa.Double(), server_default=sa.text("0"), nullable=False)
    )
    op.execute("UPDATE project_usage SET history_weight = 1")


def downgrade() -> None:
    op.drop_column("project_usage", "history_weight")
