"""DRF's progressive filling orders the queue: each job carries its project's share with the gangs ahead

Revision ID: 0026_progressive_share
Revises: 0025_history_weight
Create Date: 2026-12-14 09:00:00

Were every queued job of a project to carry its project's share (`project_usage.share`), the project
lowest in fair share would have its whole batch considered before any other project's: it could take
all the room a round has, borrow past its quota and be reclaimed by its cohort (bench/README.md, the
simulated day's reclaims). So a job's share is its project's with the gangs of the project's queued
jobs before it added (api/queues/sql.py: the claim and the positions):

- `tm_share(...)`: the dominant share of a project's history and what it holds (or would hold): the
  formula of decide.dominant_share, in one place for every statement that orders the queue, over whole
  thousandths of a CPU or GPU summed as integers. A capacity of NULL counts the resources as they are,
  as the computed column `project_usage.share` does.
- `queue_counts.cpu_millis`, `queue_counts.gpu_millis`: the gangs queued per (priority, project), kept by
  the counters trigger beside the count: a job's position counts whole groups ahead from them.
- `ix_jobs_queued_by_project` INCLUDEs `gang_cpus` and `gang_gpus`: the running sums over each
  project's head stay an index-only scan. Built CONCURRENTLY as a new index, then swapped in.

The trigger's new body and the sums' recount are one transaction that holds SHARE on jobs: a
transaction that wrote jobs before it finishes (with the old body) first, and every later one runs the
new body, so the recount is exact. If the upgrade stops in the index build, drop
`ix_jobs_queued_by_project_gangs` (it may be left invalid) and upgrade again: the first part runs again
as it is.
"""

from collections.abc import Sequence

from alembic import op

from api.queues.sql import TM_SHARE_FUNCTION, gang_millis

revision: str = "0026_progressive_share"
down_revision: str | None = "0025_history_weight"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The order's SQL lives with the queue (api/queues/sql.py), written once: `tm_share` is created from there,
# and a gang in millis is what every running sum adds (the trigger, and the statements that read the queue).
MILLIS = gang_millis("{gang}")

PLACE = "{row}.project_id || ' ' || {row}.priority || ' ' || (extract(epoch FROM {row}.created_at) * 1000000)::bigint || ' ' || {row}.id"  # noqa: E501


def counters(sums: bool) -> str:
    """The counters trigger (0008's body), with the queued gangs summed beside the count when `sums`."""
    old_cpus, new_cpus = (MILLIS.format(gang=f"{row}.gang_cpus") for row in ("OLD", "NEW"))
    old_gpus, new_gpus = (MILLIS.format(gang=f"{row}.gang_gpus") for row in ("OLD", "NEW"))
    left_sums = f", cpu_millis = cpu_millis - {old_cpus}, gpu_millis = gpu_millis - {old_gpus}" if sums else ""
    entered_sums = (
        (
            f", cpu_millis, gpu_millis) VALUES (NEW.priority, NEW.project_id, hashtext(NEW.id::text) & 7, 1,"
            f" {new_cpus}, {new_gpus})"
            " ON CONFLICT (priority, project_id, shard) DO UPDATE SET queued = q.queued + 1,"
            " cpu_millis = q.cpu_millis + excluded.cpu_millis, gpu_millis = q.gpu_millis + excluded.gpu_millis;"
        )
        if sums
        else (
            ") VALUES (NEW.priority, NEW.project_id, hashtext(NEW.id::text) & 7, 1)"
            " ON CONFLICT (priority, project_id, shard) DO UPDATE SET queued = q.queued + 1;"
        )
    )
    return f"""
CREATE OR REPLACE FUNCTION tm_job_counters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status = 'queued' THEN
            UPDATE queue_counts SET queued = queued - 1{left_sums}
            WHERE priority = OLD.priority AND project_id = OLD.project_id AND shard = hashtext(OLD.id::text) & 7;
            PERFORM pg_notify('tm_queue', {PLACE.format(row="OLD")});
        ELSIF OLD.status IN ('starting', 'running', 'cancelling') THEN
            UPDATE project_usage SET
                active = active - 1,
                gpus = CASE WHEN active = 1 THEN 0 ELSE gpus - OLD.gang_gpus::numeric END,
                cpus = CASE WHEN active = 1 THEN 0 ELSE cpus - OLD.gang_cpus::numeric END
            WHERE project_id = OLD.project_id;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.status = 'queued' THEN
            INSERT INTO queue_counts AS q (priority, project_id, shard, queued{entered_sums}
            PERFORM pg_notify('tm_queue', {PLACE.format(row="NEW")});
        ELSIF NEW.status IN ('starting', 'running', 'cancelling') THEN
            INSERT INTO project_usage AS u (project_id, active, gpus, cpus)
            VALUES (NEW.project_id, 1, NEW.gang_gpus::numeric, NEW.gang_cpus::numeric)
            ON CONFLICT (project_id) DO UPDATE SET
                active = u.active + 1, gpus = u.gpus + excluded.gpus, cpus = u.cpus + excluded.cpus;
        END IF;
    END IF;
    RETURN NULL;
END $$
"""


# The queued gangs per shard, recounted from the queued jobs (the new columns start at 0, as a shard
# with none queued stays).
RECOUNT = """
UPDATE queue_counts q SET cpu_millis = s.cpu_millis, gpu_millis = s.gpu_millis
FROM (
    SELECT priority, project_id, hashtext(id::text) & 7 AS shard,
           sum({cpus}) AS cpu_millis, sum({gpus}) AS gpu_millis
    FROM jobs WHERE status = 'queued' GROUP BY 1, 2, 3
) s
WHERE (q.priority, q.project_id, q.shard) = (s.priority, s.project_id, s.shard)
""".format(cpus=MILLIS.format(gang="gang_cpus"), gpus=MILLIS.format(gang="gang_gpus"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute(TM_SHARE_FUNCTION)
    for name in ("cpu_millis", "gpu_millis"):  # IF NOT EXISTS: an upgrade stopped in the index build runs again
        op.execute(f"ALTER TABLE queue_counts ADD COLUMN IF NOT EXISTS {name} bigint DEFAULT 0 NOT NULL")
    op.execute("LOCK TABLE jobs IN SHARE MODE")
    op.execute(counters(sums=True))
    op.execute(RECOUNT)
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_queued_by_project_gangs"
            " ON jobs (project_id, priority DESC, created_at, id) INCLUDE (gang_cpus, gang_gpus)"
            " WHERE status = 'queued'"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_jobs_queued_by_project")
        op.execute("ALTER INDEX ix_jobs_queued_by_project_gangs RENAME TO ix_jobs_queued_by_project")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_queued_by_project_keys"
            " ON jobs (project_id, priority DESC, created_at, id) WHERE status = 'queued'"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_jobs_queued_by_project")
        op.execute("ALTER INDEX ix_jobs_queued_by_project_keys RENAME TO ix_jobs_queued_by_project")
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute("LOCK TABLE jobs IN SHARE MODE")
    op.execute(counters(sums=False))
    op.drop_column("queue_counts", "gpu_millis")
    op.drop_column("queue_counts", "cpu_millis")
    op.execute("DROP FUNCTION IF EXISTS tm_share(float8, float8, bigint, bigint, float8, float8)")
