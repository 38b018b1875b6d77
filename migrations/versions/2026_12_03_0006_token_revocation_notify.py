"""Token revocations announced: NOTIFY tm_auth with the token's hash when a token is revoked or deleted

Revision ID: 0006_auth_notify
Revises: 0005_scale
Create Date: 2026-12-03 09:00:00

Every API process keeps a short-lived cache of the tokens it has checked, and LISTENs on tm_auth:
a trigger here, not the code that revokes, sends the notice, so any way a token stops being valid
(the dispatcher revoking a job's tokens, an UPDATE by hand, a project deleted with its tokens, a
TRUNCATE) evicts it from every cache as the revoking transaction commits. Catalog changes only.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006_auth_notify"
down_revision: str | None = "0005_scale"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTIONS = """
CREATE FUNCTION tm_token_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tm_auth', OLD.token_hash);
    RETURN NULL;
END $$;
CREATE FUNCTION tm_tokens_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tm_auth', '*');
    RETURN NULL;
END $$;
"""

TRIGGERS = (
    "CREATE TRIGGER tm_token_revoked AFTER UPDATE OF revoked_at, token_hash, project_id, job_id ON api_tokens"
    " FOR EACH ROW EXECUTE FUNCTION tm_token_revoked()",
    "CREATE TRIGGER tm_token_deleted AFTER DELETE ON api_tokens FOR EACH ROW EXECUTE FUNCTION tm_token_revoked()",
    "CREATE TRIGGER tm_tokens_truncated AFTER TRUNCATE ON api_tokens"
    " FOR EACH STATEMENT EXECUTE FUNCTION tm_tokens_truncated()",
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(FUNCTIONS)
    for trigger in TRIGGERS:
        op.execute(trigger)


def downgrade() -> None:
    for trigger in ("tm_token_revoked", "tm_token_deleted", "tm_tokens_truncated"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON api_tokens")
    for function in ("tm_token_revoked", "tm_tokens_truncated"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
