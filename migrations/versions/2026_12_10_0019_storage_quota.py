"""Storage quota per project: the bytes of its live checkpoints and code packages, kept as they change

Revision ID: 0019_storage_quota
Revises: 0018_checkpoint_lifecycle
Create Date: 2026-12-10 13:00:00

- `projects.storage_quota_bytes`: the bytes of live checkpoints and code packages the project may
  store; NULL: unlimited. Above it, new checkpoints and uploads are refused (api/storage/).
- `checkpoints.size_bytes`: what the checkpoint's folder held when its job reported it (NULL: not
  measured, remote storage); counted while the checkpoint is live (`deleted_at` NULL).
- `project_storage`: per project, the bytes and count of live checkpoints and the bytes of code
  packages, kept by the statement triggers below as rows are inserted, changed or deleted, so a quota
  check and `GET /v1/storage` read one row per project instead of summing a million checkpoints.
  Jobs are never deleted, so a checkpoint's project is always found through its job.

Existing checkpoints have no size (they count 0 bytes); existing code packages are counted.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_storage_quota"
down_revision: str | None = "0018_checkpoint_lifecycle"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The change of each project's figures, from one statement's rows (statement-level triggers with
# transition tables: a pass of the collector marking 200 checkpoints, or a bulk insert, is one upsert
# per project, not one per row), applied in project order so concurrent statements lock alike.
APPLY = """
    INSERT INTO project_storage AS s (project_id, checkpoint_bytes, checkpoints, code_bytes)
    SELECT project_id, sum(checkpoint_bytes), sum(checkpoints), sum(code_bytes) FROM ({changes}) change
    GROUP BY project_id HAVING sum(checkpoint_bytes) <> 0 OR sum(checkpoints) <> 0 OR sum(code_bytes) <> 0
    ORDER BY project_id
    ON CONFLICT (project_id) DO UPDATE SET
        checkpoint_bytes = s.checkpoint_bytes + EXCLUDED.checkpoint_bytes,
        checkpoints = s.checkpoints + EXCLUDED.checkpoints,
        code_bytes = s.code_bytes + EXCLUDED.code_bytes;
"""
# A checkpoint counts while it is live (`deleted_at` NULL): its rows' sign is +1 as they are now, -1 as
# they were. Its project is its job's.
LIVE = """SELECT j.project_id, {sign} * coalesce(c.size_bytes, 0) AS checkpoint_bytes,
              {sign} AS checkpoints, 0 AS code_bytes
       FROM {rows} c JOIN jobs j ON j.id = c.job_id WHERE c.deleted_at IS NULL"""
CODE = "SELECT k.project_id, 0 AS checkpoint_bytes, 0 AS checkpoints, {sign} * k.size AS code_bytes FROM {rows} k"


def counting(function: str, part: str) -> str:
    """A trigger function that applies what `part` counts of the rows a statement inserted, deleted or
    changed (the rows as they are, minus as they were)."""
    inserted = APPLY.format(changes=part.format(sign=1, rows="new_rows"))
    deleted = APPLY.format(changes=part.format(sign=-1, rows="old_rows"))
    updated = APPLY.format(
        changes=part.format(sign=1, rows="new_rows") + " UNION ALL " + part.format(sign=-1, rows="old_rows")
    )
    return f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN {inserted}
    ELSIF TG_OP = 'DELETE' THEN {deleted}
    ELSE {updated}
    END IF;
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("projects", sa.Column("storage_quota_bytes", sa.BigInteger(), nullable=True))
    op.add_column("checkpoints", sa.Column("size_bytes", sa.BigInteger(), nullable=True))
    op.create_table(
        "project_storage",
        sa.Column("project_id", sa.UUID(), nullable=False),
        sa.Column("checkpoint_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("checkpoints", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("code_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_project_storage_project_id_projects"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_project_storage")),
    )
    op.execute(counting("tm_checkpoint_storage", LIVE))
    op.execute(counting("tm_code_storage", CODE))
    for table, function in (("checkpoints", "tm_checkpoint_storage"), ("code_packages", "tm_code_storage")):
        for event, transition in (("INSERT", "NEW TABLE AS new_rows"), ("DELETE", "OLD TABLE AS old_rows")):
            op.execute(
                f"CREATE TRIGGER {function}_{event.lower()} AFTER {event} ON {table} REFERENCING {transition}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
            )
        op.execute(
            f"CREATE TRIGGER {function}_update AFTER UPDATE ON {table}"
            f" REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
    op.execute(
        """
        INSERT INTO project_storage (project_id, checkpoint_bytes, checkpoints, code_bytes)
        SELECT p.id,
               0,
               (SELECT count(*) FROM checkpoints c JOIN jobs j ON j.id = c.job_id
                WHERE j.project_id = p.id AND c.deleted_at IS NULL),
               (SELECT coalesce(sum(k.size), 0) FROM code_packages k WHERE k.project_id = p.id)
        FROM projects p
        """
    )


def downgrade() -> None:
    for table, function in (("checkpoints", "tm_checkpoint_storage"), ("code_packages", "tm_code_storage")):
        for event in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS {function}_{event} ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("project_storage")
    op.drop_column("checkpoints", "size_bytes")
    op.drop_column("projects", "storage_quota_bytes")
