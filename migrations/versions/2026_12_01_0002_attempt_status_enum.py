"""job_attempts.status becomes the attempt_status enum

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VALUES = ("pending", "submitted", "running", "timing_out", "succeeded", "failed", "lost", "stopped", "timed_out")
attempt_status = sa.Enum(*VALUES, name="attempt_status")


def upgrade() -> None:
    attempt_status.create(op.get_bind(), checkfirst=True)
    # A value outside the enum fails the cast, and with it the migration: nothing is silently rewritten.
    op.alter_column(
        "job_attempts",
        "status",
        existing_type=sa.String(length=32),
        type_=attempt_status,
        existing_nullable=False,
        postgresql_using="status::attempt_status",
    )


def downgrade() -> None:
    op.alter_column(
        "job_attempts",
        "status",
        existing_type=attempt_status,
        type_=sa.String(length=32),
        existing_nullable=False,
        postgresql_using="status::text",
    )
    attempt_status.drop(op.get_bind(), checkfirst=True)
