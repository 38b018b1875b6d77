"""Project quotas and cohorts: a nominal quota per resource, a cohort whose members lend each other
what they leave unused, and each member's borrowing and lending limits

Revision ID: 0015_project_quotas
Revises: 0014_job_token_claims
Create Date: 2026-12-10 09:00:00

- `projects.quota` (JSON object, resource name -> amount; `{}`, the default, limits nothing: today's
  projects keep admitting as before). A constant default: a catalogue change, no table rewrite.
- `projects.cohort` (a name, nullable): projects with the same cohort lend each other unused quota.
- `projects.borrowing_limit`, `projects.lending_limit` (JSON objects, nullable: no limit).
None of them fires the project trigger of 0013 (cached principals do not carry them).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015_project_quotas"
down_revision: str | None = "0014_job_token_claims"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column(
        "projects", sa.Column("quota", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False)
    )
    op.add_column("projects", sa.Column("cohort", sa.String(length=64), nullable=True))
    op.add_column("projects", sa.Column("borrowing_limit", postgresql.JSONB(), nullable=True))
    op.add_column("projects", sa.Column("lending_limit", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    for column in ("lending_limit", "borrowing_limit", "cohort", "quota"):
        op.drop_column("projects", column)
