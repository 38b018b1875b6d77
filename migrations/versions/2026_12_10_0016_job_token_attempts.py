"""Job tokens name their attempt: writes from an attempt that was superseded are refused and counted

Revision ID: 0016_job_token_attempts
Revises: 0015_project_quotas
Create Date: 2026-12-10 10:00:00

- `api_tokens.attempt` (nullable: a catalogue change, no rewrite): the attempt a job token was made for.
  A job token authenticates only while its attempt is its job's latest; presented once the attempt is
  superseded or ended (the token revoked with it), the API answers 409 and counts the write in the job's
  `fenced` event (api/auth/service.py). Job tokens made before this migration name no attempt and keep
  today's behaviour (revoked: 401).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_job_token_attempts"
down_revision: str | None = "0015_project_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("api_tokens", sa.Column("attempt", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("api_tokens", "attempt")
