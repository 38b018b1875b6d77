"""`project_usage.share` computed by `tm_share`, the queue's one formula of a dominant share

Revision ID: 0029_share_from_tm_share
Revises: 0028_measured_sizes
Create Date: 2026-12-17 09:00:00

The stored column carried its own copy of the dominant-share formula; it is now `tm_share` over what the
project holds (api/queues/sql.py, SHARE_COLUMN), so the formula is written once in SQL. A generated
column's expression cannot be altered on PostgreSQL 15: the column is dropped and added again in one
transaction (project_usage holds a row per project: the rewrite is small). Readers of the column see
the same values before and after, so a running API of the previous release keeps working.
"""

from collections.abc import Sequence

from alembic import op

from api.queues.sql import SHARE_COLUMN

revision: str = "0029_share_from_tm_share"
down_revision: str | None = "0028_measured_sizes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The expression 0020 created, for downgrade.
PREVIOUS = (
    "greatest(history_cpus + CASE WHEN cpu_capacity IS NULL THEN CAST(cpus AS double precision)"
    " WHEN cpu_capacity > 0 THEN CAST(cpus / cpu_capacity AS double precision) ELSE 0 END,"
    " history_gpus + CASE WHEN gpu_capacity IS NULL THEN CAST(gpus AS double precision)"
    " WHEN gpu_capacity > 0 THEN CAST(gpus / gpu_capacity AS double precision) ELSE 0 END)"
)


def _share_column(expression: str) -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("ALTER TABLE project_usage DROP COLUMN share")
    op.execute(f"ALTER TABLE project_usage ADD COLUMN share double precision GENERATED ALWAYS AS ({expression}) STORED")


def upgrade() -> None:
    _share_column(SHARE_COLUMN)


def downgrade() -> None:
    _share_column(PREVIOUS)
