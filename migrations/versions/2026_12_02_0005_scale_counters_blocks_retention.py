"""Scale: maintained queue counts and project usage, metric blocks, indexes for pages and retention

Revision ID: 0005_scale
Revises: 0004_preemption
Create Date: 2026-12-02 15:00:00

Online-safe on big tables, step by step (docs/scaling.md says the same):
1. One short transaction, under `lock_timeout` (it gives up instead of queueing writers behind it):
   `jobs.purged_at` is a nullable column without a default (a catalog change, no rewrite); three new
   tables; the triggers (CREATE TRIGGER takes SHARE ROW EXCLUSIVE on jobs and metric_points: it waits
   for writers in flight and holds new ones off until this transaction commits). While that lock is
   held the counters are filled from the queued and active jobs only (the partial status index, not
   the whole table), and the last metric sequence number is read, so every later point is counted
   by the trigger and every earlier one by step 3, none by both.
2. Indexes on jobs with CREATE INDEX CONCURRENTLY (no lock that blocks reads or writes).
3. metric_blocks for the points stored before the trigger, 65,536 sequence numbers per transaction:
   reads of metric_points and short inserts; ingest goes on meanwhile.
If it stops part-way, `alembic downgrade 0004_preemption` and upgrade again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005_scale"
down_revision: str | None = "0004_preemption"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_SEQS = 1 << 16

# Shared with api/metrics/repository.py (BLOCK_SHIFT = 12): the block of a point is seq >> 12.
BLOCKS_FROM = """
    INSERT INTO metric_blocks AS b (job_id, name, rank, block, n, stepped, min_step, max_step,
                                    lo_value, lo_seq, lo_step, lo_ts, hi_value, hi_seq, hi_step, hi_ts)
    SELECT job_id, name, rank, seq >> 12, count(*), count(step), min(step), max(step),
           (array_agg(value ORDER BY value, seq))[1], (array_agg(seq ORDER BY value, seq))[1],
           (array_agg(step ORDER BY value, seq))[1], (array_agg(ts ORDER BY value, seq))[1],
           (array_agg(value ORDER BY value DESC, seq))[1], (array_agg(seq ORDER BY value DESC, seq))[1],
           (array_agg(step ORDER BY value DESC, seq))[1], (array_agg(ts ORDER BY value DESC, seq))[1]
    FROM {source}
    GROUP BY job_id, name, rank, seq >> 12
    ON CONFLICT (job_id, name, rank, block) DO UPDATE SET
        n = b.n + excluded.n,
        stepped = b.stepped + excluded.stepped,
        min_step = least(b.min_step, excluded.min_step),
        max_step = greatest(b.max_step, excluded.max_step),
        lo_value = CASE WHEN excluded.lo_value < b.lo_value THEN excluded.lo_value ELSE b.lo_value END,
        lo_seq = CASE WHEN excluded.lo_value < b.lo_value THEN excluded.lo_seq ELSE b.lo_seq END,
        lo_step = CASE WHEN excluded.lo_value < b.lo_value THEN excluded.lo_step ELSE b.lo_step END,
        lo_ts = CASE WHEN excluded.lo_value < b.lo_value THEN excluded.lo_ts ELSE b.lo_ts END,
        hi_value = CASE WHEN excluded.hi_value > b.hi_value THEN excluded.hi_value ELSE b.hi_value END,
        hi_seq = CASE WHEN excluded.hi_value > b.hi_value THEN excluded.hi_seq ELSE b.hi_seq END,
        hi_step = CASE WHEN excluded.hi_value > b.hi_value THEN excluded.hi_step ELSE b.hi_step END,
        hi_ts = CASE WHEN excluded.hi_value > b.hi_value THEN excluded.hi_ts ELSE b.hi_ts END
"""

# Deferred to commit: a counter row is locked only while its transaction commits, so concurrent
# submissions do not wait on each other for the rest of their request.
JOB_COUNTERS = """
CREATE FUNCTION tm_job_counters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status = 'queued' THEN
            UPDATE queue_counts SET queued = queued - 1
            WHERE priority = OLD.priority AND project_id = OLD.project_id AND shard = hashtext(OLD.id::text) & 7;
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
            INSERT INTO queue_counts AS q (priority, project_id, shard, queued)
            VALUES (NEW.priority, NEW.project_id, hashtext(NEW.id::text) & 7, 1)
            ON CONFLICT (priority, project_id, shard) DO UPDATE SET queued = q.queued + 1;
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

JOB_COUNTERS_RESET = """
CREATE FUNCTION tm_job_counters_reset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_counts;
    DELETE FROM project_usage;
    RETURN NULL;
END $$
"""

METRIC_BLOCKS = f"""
CREATE FUNCTION tm_metric_blocks_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {BLOCKS_FROM.format(source="new_points")};
    RETURN NULL;
END $$
"""

TRIGGERS = (
    "CREATE CONSTRAINT TRIGGER tm_job_counters_insert AFTER INSERT ON jobs"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tm_job_counters()",
    "CREATE CONSTRAINT TRIGGER tm_job_counters_update AFTER UPDATE ON jobs"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
    " WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.priority IS DISTINCT FROM NEW.priority"
    " OR OLD.project_id IS DISTINCT FROM NEW.project_id OR OLD.gang_gpus IS DISTINCT FROM NEW.gang_gpus"
    " OR OLD.gang_cpus IS DISTINCT FROM NEW.gang_cpus)"
    " EXECUTE FUNCTION tm_job_counters()",
    "CREATE CONSTRAINT TRIGGER tm_job_counters_delete AFTER DELETE ON jobs"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tm_job_counters()",
    "CREATE TRIGGER tm_job_counters_truncate AFTER TRUNCATE ON jobs"
    " FOR EACH STATEMENT EXECUTE FUNCTION tm_job_counters_reset()",
    "CREATE TRIGGER tm_metric_blocks AFTER INSERT ON metric_points"
    " REFERENCING NEW TABLE AS new_points FOR EACH STATEMENT EXECUTE FUNCTION tm_metric_blocks_add()",
)

INDEXES = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_project_id_status_created_at_id"
    " ON jobs (project_id, status, created_at DESC, id DESC)",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_queued_by_project"
    " ON jobs (project_id, priority DESC, created_at, id) WHERE status = 'queued'",
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_unpurged_finished_at"
    " ON jobs (finished_at) WHERE purged_at IS NULL AND finished_at IS NOT NULL",
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("jobs", sa.Column("purged_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "metric_blocks",
        sa.Column("job_id", postgresql.UUID(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("stepped", sa.Integer(), nullable=False),
        sa.Column("min_step", sa.BigInteger(), nullable=True),
        sa.Column("max_step", sa.BigInteger(), nullable=True),
        sa.Column("lo_value", sa.Double(), nullable=False),
        sa.Column("lo_seq", sa.BigInteger(), nullable=False),
        sa.Column("lo_step", sa.BigInteger(), nullable=True),
        sa.Column("lo_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hi_value", sa.Double(), nullable=False),
        sa.Column("hi_seq", sa.BigInteger(), nullable=False),
        sa.Column("hi_step", sa.BigInteger(), nullable=True),
        sa.Column("hi_ts", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_metric_blocks_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "name", "rank", "block", name="pk_metric_blocks"),
    )
    op.create_table(
        "queue_counts",
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("project_id", postgresql.UUID(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_queue_counts_project_id_projects", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("priority", "project_id", "shard", name="pk_queue_counts"),
    )
    op.create_table(
        "project_usage",
        sa.Column("project_id", postgresql.UUID(), nullable=False),
        sa.Column("active", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Numeric(), nullable=False),
        sa.Column("cpus", sa.Numeric(), nullable=False),
        sa.CheckConstraint("active >= 0", name="ck_project_usage_active_not_negative"),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_project_usage_project_id_projects", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("project_id", name="pk_project_usage"),
    )
    for function in (JOB_COUNTERS, JOB_COUNTERS_RESET, METRIC_BLOCKS):
        op.execute(function)
    for trigger in TRIGGERS:
        op.execute(trigger)
    op.execute(
        "INSERT INTO queue_counts (priority, project_id, shard, queued)"
        " SELECT priority, project_id, hashtext(id::text) & 7, count(*) FROM jobs WHERE status = 'queued'"
        " GROUP BY 1, 2, 3"
    )
    op.execute(
        "INSERT INTO project_usage (project_id, active, gpus, cpus)"
        " SELECT project_id, count(*), sum(gang_gpus::numeric), sum(gang_cpus::numeric) FROM jobs"
        " WHERE status IN ('starting', 'running', 'cancelling') GROUP BY project_id"
    )
    bind = op.get_bind()
    last_seq = bind.execute(sa.text("SELECT coalesce(max(seq), 0) FROM metric_points")).scalar_one()
    with op.get_context().autocommit_block():
        for index in INDEXES:
            op.execute(index)
        first_seq = bind.execute(sa.text("SELECT coalesce(min(seq), 1) FROM metric_points")).scalar_one()
        for low in range(first_seq - 1, last_seq, BACKFILL_SEQS):
            high = min(low + BACKFILL_SEQS, last_seq)
            source = f"(SELECT * FROM metric_points WHERE seq > {low} AND seq <= {high}) AS stored"
            op.execute(BLOCKS_FROM.format(source=source))


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in (
            "ix_jobs_unpurged_finished_at",
            "ix_jobs_queued_by_project",
            "ix_jobs_project_id_status_created_at_id",
        ):
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    op.execute("SET LOCAL lock_timeout = '10s'")
    for trigger, table in (
        ("tm_metric_blocks", "metric_points"),
        ("tm_job_counters_truncate", "jobs"),
        ("tm_job_counters_delete", "jobs"),
        ("tm_job_counters_update", "jobs"),
        ("tm_job_counters_insert", "jobs"),
    ):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    for function in ("tm_metric_blocks_add", "tm_job_counters_reset", "tm_job_counters"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}()")
    op.drop_table("project_usage")
    op.drop_table("queue_counts")
    op.drop_table("metric_blocks")
    op.drop_column("jobs", "purged_at")
