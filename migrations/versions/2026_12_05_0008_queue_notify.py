"""Queue moves announced: NOTIFY tm_queue for every job that enters or leaves the queue

Revision ID: 0008_queue_notify
Revises: 0007_jobs_autovacuum
Create Date: 2026-12-05 09:00:00

Each API process keeps, per queued job, how many queued jobs of its own project and priority are older
(api/queues/ranks.py), instead of counting them on every poll. The jobs counters trigger (0005), which
already runs for exactly the changes that move a job into or out of the queue (insert, status,
priority, project), now also sends `NOTIFY tm_queue, '<project> <priority> <created_at µs> <id>'` for
the job that left and the one that entered, and the TRUNCATE trigger '*': every way the queue changes
(submission, admission, cancellation, a retry put back, an UPDATE by hand) reaches every cache as the
transaction commits. The trigger is deferred to commit already; the notices go out with the commit.

Online: CREATE OR REPLACE FUNCTION changes the catalog only; the triggers stay as they are.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008_queue_notify"
down_revision: str | None = "0007_jobs_autovacuum"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The place of a job in its group's queue order, as api/jobs/repository.py (READ_JOB) reads it too.
PLACE = "{row}.project_id || ' ' || {row}.priority || ' ' || (extract(epoch FROM {row}.created_at) * 1000000)::bigint || ' ' || {row}.id"  # noqa: E501


def counters(notify: bool) -> str:
    left = f"PERFORM pg_notify('tm_queue', {PLACE.format(row='OLD')});" if notify else ""
    entered = f"PERFORM pg_notify('tm_queue', {PLACE.format(row='NEW')});" if notify else ""
    return f"""
CREATE OR REPLACE FUNCTION tm_job_counters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status = 'queued' THEN
            UPDATE queue_counts SET queued = queued - 1
            WHERE priority = OLD.priority AND project_id = OLD.project_id AND shard = hashtext(OLD.id::text) & 7;
            {left}
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
            {entered}
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


def reset(notify: bool) -> str:
    return f"""
CREATE OR REPLACE FUNCTION tm_job_counters_reset() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_counts;
    DELETE FROM project_usage;
    {"PERFORM pg_notify('tm_queue', '*');" if notify else ""}
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(counters(notify=True))
    op.execute(reset(notify=True))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(counters(notify=False))
    op.execute(reset(notify=False))
