"""A token minted by a token names it (`api_tokens.parent_id`) and is revoked with it

Revision ID: 0027_token_parent
Revises: 0026_progressive_share
Create Date: 2026-12-15 09:00:00

POST /v1/tokens lets a token mint tokens. What a token minted must not outlive it: revoking a leaked
token must also stop whatever its holder minted with it. So:

- `api_tokens.parent_id`: the token that minted this one (NULL: made outside a request, by
  `trainmaster token create` or `trainmaster up`, or a job token). Deleting a token deletes what it
  minted (ON DELETE CASCADE), as deleting a project deletes its tokens.
- `tm_token_revoke_children`: a trigger, not the code that revokes, so any way a token is revoked
  (DELETE /v1/tokens/{id}, the dispatcher, an UPDATE by hand) revokes the tokens it minted in the same
  transaction, and theirs in turn (the trigger fires again on each). The revocation NOTIFY of 0006 fires
  for every row revoked, so every API process drops them all from its cache at the commit.

Tokens minted before this revision have no parent: nothing links them to the token that minted them, so
they keep their own expiry (possibly none) and are not revoked with it. An operator who revokes a token
that may have minted others lists the project's tokens (`trainmaster token ls`) and revokes those made
while it was in use.

The column is added empty (no rewrite); the index is partial, over the rows that have a parent, so its
build reads api_tokens once and holds writes to it for that read only.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_token_parent"
down_revision: str | None = "0026_progressive_share"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REVOKE_CHILDREN = """
CREATE FUNCTION tm_token_revoke_children() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE api_tokens SET revoked_at = NEW.revoked_at WHERE parent_id = NEW.id AND revoked_at IS NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER tm_token_revoke_children AFTER UPDATE OF revoked_at ON api_tokens
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION tm_token_revoke_children();
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("api_tokens", sa.Column("parent_id", sa.UUID(), nullable=True))
    op.create_foreign_key(
        "fk_api_tokens_parent_id_api_tokens", "api_tokens", "api_tokens", ["parent_id"], ["id"], ondelete="CASCADE"
    )
    op.create_index(
        "ix_api_tokens_parent_id", "api_tokens", ["parent_id"], postgresql_where=sa.text("parent_id IS NOT NULL")
    )
    op.execute(REVOKE_CHILDREN)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("DROP TRIGGER IF EXISTS tm_token_revoke_children ON api_tokens")
    op.execute("DROP FUNCTION IF EXISTS tm_token_revoke_children()")
    op.drop_index("ix_api_tokens_parent_id", table_name="api_tokens")
    op.drop_constraint("fk_api_tokens_parent_id_api_tokens", "api_tokens", type_="foreignkey")
    op.drop_column("api_tokens", "parent_id")
