"""Job tokens are claimed: a launch carries a single-use claim, never the token itself

Revision ID: 0014_job_token_claims
Revises: 0013_trust_domains
Create Date: 2026-12-09 09:00:00

Every job on a Ray cluster can read every other job's runtime environment through the Jobs API, so a
job token written there was anyone's. Now the dispatcher writes a job token row whose `token_hash` is
the hash of a claim. The claim goes into the launch. A job token row that has not been claimed
(`claimed_at` NULL) authenticates nothing. The driver exchanges the claim once (`POST /v1/tokens/claim`)
for the real token: `token_hash` becomes the new token's, and `claim_hash` keeps the claim's. A claim
presented again finds that row by `claim_hash`, and its token is revoked, since someone else may hold it.

- `api_tokens.claimed_at` and `api_tokens.claim_hash` (nullable: catalogue changes only, no rewrite),
  and a partial index on `claim_hash` for the replay check.
- Job tokens issued before this migration were handed to their jobs whole: they count as claimed
  (`claimed_at = created_at`), so running jobs keep reporting across the upgrade.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_job_token_claims"
down_revision: str | None = "0013_trust_domains"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("api_tokens", sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_tokens", sa.Column("claim_hash", sa.String(length=64), nullable=True))
    op.execute("UPDATE api_tokens SET claimed_at = created_at WHERE job_id IS NOT NULL")
    op.create_index(
        op.f("ix_api_tokens_claim_hash"),
        "api_tokens",
        ["claim_hash"],
        unique=True,
        postgresql_where=sa.text("claim_hash IS NOT NULL"),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.drop_index(op.f("ix_api_tokens_claim_hash"), table_name="api_tokens")
    op.drop_column("api_tokens", "claim_hash")
    op.drop_column("api_tokens", "claimed_at")
