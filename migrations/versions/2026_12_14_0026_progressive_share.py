"""DRF's progressive filling orders the queue: each job carries its project's share with the gangs ahead

Revision ID: 0026_progressive_share
Revises: 0025_history_weight
Create Date: 2026-12-14 09:00:00

Before, every queued job of a project carried its project's share (`project_usage.share`), so the
project lowest in fair share had its whole batch considered before any other project's: it could take
all the room a round had, borrow past its quota and be reclaimed by its cohort (bench/README.md, stop 46:
8,991 reclaims in the simulated day). Now a job's share is its project's with the gangs of the project's
queued jobs before it added (api/dispatcher/repository.py, `lock_queued`; api/jobs/repository.py, positions):

- `tm_share(...)`: the dominant share of a project's history and what it holds (or would hold): the
  formula of decide.dominant_share, in one place for every statement that orders the queue. A
  capacity of NULL counts the resources as they are, as the computed column `project_usage.share` does.
- `queue_counts.cpus`, `queue_counts.gpus`: the gangs queued per (priority, project), kept by the
  counters trigger beside the count: a job's position counts whole groups ahead from them.
- `ix_jobs_queued_by_project` INCLUDEs `gang_cpus` and `gang_gpus`: the running sums over each
  project's head stay an index-only scan. Built CONCURRENTLY as a new index, then swapped in.

The trigger's new body and the sums' recount are one transaction that holds SHARE on jobs: a
transaction that wrote jobs before it finishes (with the old body) first, and every later one runs the
new body, so the recount is exact.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026_progressive_share"
down_revision: str | None = "0025_history_weight"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# decide.dominant_share in SQL: `cpus`/`gpus` is what the project holds plus the gangs ahead, numeric (the
# sums are exact, so two statements summing the same gangs compute the same share to the bit).
TM_SHARE = """
CREATE OR REPLACE FUNCTION tm_share(
    history_cpus double precision, history_gpus double precision,
    cpus numeric, gpus numeric, cpu_capacity numeric, gpu_capacity numeric
) RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(
        history_cpus + CAST(CASE WHEN cpu_capacity IS NULL THEN cpus
                                 WHEN cpu_capacity > 0 THEN cpus / cpu_capacity ELSE 0 END AS double precision),
        history_gpus + CAST(CASE WHEN gpu_capacity IS NULL THEN gpus
                                 WHEN gpu_capacity > 0 THEN gpus / gpu_capacity ELSE 0 END AS double precision))
$$
"""

PLACE = "{row}.project_id || ' ' || {row}.priority || ' ' || (extract(epoch FROM {row}.created_at) * 1000000)::bigint || ' ' || {row}.id"  # noqa: E501


def counters(sums: bool) -> str:
    """The counters trigger (0008's body), with the queued gangs summed beside the count when `sums`."""
    left_sums = ", cpus = cpus - OLD.gang_cpus::numeric, gpus = gpus - OLD.gang_gpus::numeric" if sums else ""
    entered_sums = (
        (
            ", cpus, gpus) VALUES (NEW.priority, NEW.project_id, hashtext(NEW.id::text) & 7, 1,"
            " NEW.gang_cpus::numeric, NEW.gang_gpus::numeric)"
            " ON CONFLICT (priority, project_id, shard) DO UPDATE SET queued = q.queued + 1,"
            " cpus = q.cpus + excluded.cpus, gpus = q.gpus + excluded.gpus;"
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


RECOUNT = """
UPDATE queue_counts q SET cpus = coalesce(s.cpus, 0), gpus = coalesce(s.gpus, 0)
FROM queue_counts k LEFT JOIN (
    SELECT priority, project_id, hashtext(id::text) & 7 AS shard,
           sum(gang_cpus::numeric) AS cpus, sum(gang_gpus::numeric) AS gpus
    FROM jobs WHERE status = 'queued' GROUP BY 1, 2, 3
) s USING (priority, project_id, shard)
WHERE (q.priority, q.project_id, q.shard) = (k.priority, k.project_id, k.shard)
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.execute(TM_SHARE)
    op.add_column("queue_counts", sa.Column("cpus", sa.Numeric(), server_default=sa.text("0"), nullable=False))
    op.add_column("queue_counts", sa.Column("gpus", sa.Numeric(), server_default=sa.text("0"), nullable=False))
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
    op.drop_column("queue_counts", "gpus")
    op.drop_column("queue_counts", "cpus")
    op.execute("DROP FUNCTION IF EXISTS tm_share(float8, float8, numeric, numeric, numeric, numeric)")
