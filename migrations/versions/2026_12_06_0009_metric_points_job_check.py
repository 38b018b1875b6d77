"""metric_points.job_id: the foreign key's guarantees kept by statement triggers, checked once per batch

Revision ID: 0009_points_job_check
Revises: 0008_queue_notify
Create Date: 2026-12-06 09:00:00

A foreign key checks every inserted row on its own: for a metric batch of 1,000 points, 1,000 lookups
of the same job row, each locking it FOR KEY SHARE through its own query: the largest part of what
PostgreSQL spends on such a batch (bench/README.md), and ingest holds its job's lock for all of it.
Three triggers keep what the key promised:

- after an INSERT statement on metric_points, the jobs it wrote to are locked FOR KEY SHARE, as the
  per-row check locks them, and one that does not exist fails the statement with foreign_key_violation
  (23503), the key's own error: once per statement, whatever its size;
- after a DELETE statement on jobs (a project's delete cascading to its jobs included), their points
  are deleted, as ON DELETE CASCADE did; a job being written to waits for the writer (its lock), and
  the delete then sees the points it committed;
- after a TRUNCATE of jobs, metric_points is emptied too (a TRUNCATE ... CASCADE no longer reaches it;
  name metric_points in the TRUNCATE, as the tests do, to empty it the fast way).

Online: dropping the key and creating the triggers are catalog changes, each under `lock_timeout`; no
row is read or rewritten.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009_points_job_check"
down_revision: str | None = "0008_queue_notify"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTIONS = (
    """
CREATE FUNCTION tm_metric_points_job_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted bigint;
    locked bigint;
    missing uuid;
BEGIN
    WITH named AS (SELECT DISTINCT job_id FROM new_points)
    SELECT (SELECT count(*) FROM named),
           (SELECT count(*) FROM (SELECT FROM jobs WHERE id IN (SELECT job_id FROM named) FOR KEY SHARE) AS l)
    INTO wanted, locked;
    IF locked < wanted THEN
        SELECT n.job_id INTO missing FROM new_points AS n
        WHERE NOT EXISTS (SELECT FROM jobs WHERE jobs.id = n.job_id) LIMIT 1;
        RAISE EXCEPTION 'insert on table "metric_points" names a job that does not exist'
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metric_points', COLUMN = 'job_id',
                  DETAIL = format('Key (job_id)=(%s) is not present in table "jobs".', missing);
    END IF;
    RETURN NULL;
END $$
""",
    """
CREATE FUNCTION tm_jobs_delete_points() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM metric_points WHERE job_id IN (SELECT id FROM old_jobs);
    RETURN NULL;
END $$
""",
    """
CREATE FUNCTION tm_jobs_truncate_points() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM metric_points;  -- TRUNCATE here fails when the same command truncates metric_points too
    RETURN NULL;
END $$
""",
)

TRIGGERS = (
    "CREATE TRIGGER tm_metric_points_job_check AFTER INSERT ON metric_points"
    " REFERENCING NEW TABLE AS new_points FOR EACH STATEMENT EXECUTE FUNCTION tm_metric_points_job_check()",
    "CREATE TRIGGER tm_jobs_delete_points AFTER DELETE ON jobs"
    " REFERENCING OLD TABLE AS old_jobs FOR EACH STATEMENT EXECUTE FUNCTION tm_jobs_delete_points()",
    "CREATE TRIGGER tm_jobs_truncate_points AFTER TRUNCATE ON jobs"
    " FOR EACH STATEMENT EXECUTE FUNCTION tm_jobs_truncate_points()",
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.drop_constraint("fk_metric_points_job_id_jobs", "metric_points", type_="foreignkey")
    for statement in (*FUNCTIONS, *TRIGGERS):
        op.execute(statement)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    for trigger, table in (
        ("tm_jobs_truncate_points", "jobs"),
        ("tm_jobs_delete_points", "jobs"),
        ("tm_metric_points_job_check", "metric_points"),
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    for function in ("tm_jobs_truncate_points", "tm_jobs_delete_points", "tm_metric_points_job_check"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.execute("DELETE FROM metric_points p WHERE NOT EXISTS (SELECT FROM jobs j WHERE j.id = p.job_id)")
    op.create_foreign_key(
        "fk_metric_points_job_id_jobs", "metric_points", "jobs", ["job_id"], ["id"], ondelete="CASCADE"
    )
