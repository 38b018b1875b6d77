"""Trust domains: clusters as records, each project bound to one (with its max_priority); tokens with a
scope, an expiry and a last use

Revision ID: 0013_trust_domains
Revises: 0012_job_event_repeats
Create Date: 2026-12-08 09:00:00

- `clusters`: the Ray clusters the platform dispatches to: name, Ray address, where its Ray token is
  read from (a file path or an environment variable's name, never the token) and labels. The cluster
  `default` is created here with the address the platform uses today (TRAINMASTER_RAY_ADDRESS of the
  process that migrates, else the local default); `trainmaster up` sets it to its own Ray head.
- `projects.cluster_id` (every existing project is bound to `default`) and `projects.max_priority`
  (100: today's range stays open). projects is small: a backfill then NOT NULL.
- `api_tokens.scope` (`admin` · `project` · `job` · `metrics`; NOT NULL with a constant default, a
  catalogue change only; active job tokens are marked `job`), `expires_at`, `last_used_at` and
  `user_name` (nullable: catalogue only). No table rewrite of api_tokens.
- The revocation trigger of 0006 also fires on a changed scope or expiry; a changed project (its
  cluster, its max_priority, its name) evicts every cached token (`NOTIFY tm_auth, '*'`), since cached
  principals carry them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013_trust_domains"
down_revision: str | None = "0012_job_event_repeats"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_TRIGGER_COLUMNS_OLD = "revoked_at, token_hash, project_id, job_id"
TOKEN_TRIGGER_COLUMNS_NEW = "revoked_at, token_hash, project_id, job_id, scope, expires_at"

PROJECT_CHANGED = """
CREATE FUNCTION tm_project_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tm_auth', '*');
    RETURN NULL;
END $$;
"""


def _default_ray_address() -> str:
    try:
        from api.settings import Settings

        return Settings().ray_address
    except Exception:  # pragma: no cover - a migration run without the server's settings
        return "http://127.0.0.1:8265"


def _token_trigger(columns: str) -> None:
    op.execute("DROP TRIGGER IF EXISTS tm_token_revoked ON api_tokens")
    op.execute(
        f"CREATE TRIGGER tm_token_revoked AFTER UPDATE OF {columns} ON api_tokens"
        " FOR EACH ROW EXECUTE FUNCTION tm_token_revoked()"
    )


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.create_table(
        "clusters",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("token_file", sa.Text(), nullable=True),
        sa.Column("token_env", sa.String(length=256), nullable=True),
        sa.Column("labels", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
        sa.UniqueConstraint("name", name=op.f("uq_clusters_name")),
    )
    op.execute(
        sa.text("INSERT INTO clusters (id, name, address) VALUES (gen_random_uuid(), 'default', :address)").bindparams(
            address=_default_ray_address()
        )
    )
    op.add_column("projects", sa.Column("cluster_id", sa.UUID(), nullable=True))
    op.add_column(
        "projects", sa.Column("max_priority", sa.SmallInteger(), server_default=sa.text("100"), nullable=False)
    )
    op.execute("UPDATE projects SET cluster_id = (SELECT id FROM clusters WHERE name = 'default')")
    op.alter_column("projects", "cluster_id", nullable=False)
    op.create_foreign_key(
        op.f("fk_projects_cluster_id_clusters"), "projects", "clusters", ["cluster_id"], ["id"], ondelete="RESTRICT"
    )
    op.create_index(op.f("ix_projects_cluster_id"), "projects", ["cluster_id"])

    op.add_column(
        "api_tokens", sa.Column("scope", sa.String(length=16), server_default=sa.text("'project'"), nullable=False)
    )
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_tokens", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("api_tokens", sa.Column("user_name", sa.String(length=128), nullable=True))
    # Only the live job tokens (a few per running job) are rewritten; revoked ones keep `project`,
    # and the code reads a token with a job_id as a job token whatever its scope says.
    op.execute("UPDATE api_tokens SET scope = 'job' WHERE job_id IS NOT NULL AND revoked_at IS NULL")
    _token_trigger(TOKEN_TRIGGER_COLUMNS_NEW)
    op.execute(PROJECT_CHANGED)
    op.execute(
        "CREATE TRIGGER tm_project_changed AFTER UPDATE OF name, cluster_id, max_priority ON projects"
        " FOR EACH ROW EXECUTE FUNCTION tm_project_changed()"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("DROP TRIGGER IF EXISTS tm_project_changed ON projects")
    op.execute("DROP FUNCTION IF EXISTS tm_project_changed()")
    _token_trigger(TOKEN_TRIGGER_COLUMNS_OLD)
    for column in ("user_name", "last_used_at", "expires_at", "scope"):
        op.drop_column("api_tokens", column)
    op.drop_index(op.f("ix_projects_cluster_id"), table_name="projects")
    op.drop_constraint(op.f("fk_projects_cluster_id_clusters"), "projects", type_="foreignkey")
    op.drop_column("projects", "max_priority")
    op.drop_column("projects", "cluster_id")
    op.drop_table("clusters")
