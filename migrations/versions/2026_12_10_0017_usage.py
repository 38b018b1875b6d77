"""Usage accounting: each ended attempt's seconds split into starting, productive and lost, rolled up
per hour, project and user as attempts end; who submitted each job

Revision ID: 0017_usage
Revises: 0016_job_token_attempts
Create Date: 2026-12-10 11:00:00

- `jobs.user_name` (nullable: catalogue only): the user the submitting token names (`token create --user`).
- `job_attempts.running_at`: when the attempt's workers reported they started (its training runs);
  `queue_s`, `starting_s`, `productive_s`, `lost_s` (nullable): written by the trigger below when the
  attempt ends. Allocated = starting + productive + lost (from admission, `created_at`, to release,
  `finished_at`). Lost is the work since the attempt's last checkpoint (or since it started running) that
  a failure, loss, preemption, cancel or timeout threw away; a succeeded attempt loses nothing. Queue time
  is from the job's submission (first attempt) or the previous attempt's end to this attempt's admission.
- `usage_hours` and `usage_days`: per (project, UTC hour or day the attempt ended, user) the sums of those
  seconds times the gang's CPUs and GPUs, kept by the same trigger, so `GET /v1/usage` reads whole days
  from the days and only the partial days at a range's ends from the hours, however many attempts there were.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_usage"
down_revision: str | None = "0016_job_token_attempts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ATTEMPT_ENDED_TEMPLATE = """
CREATE FUNCTION tm_attempt_ended() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    job record;
    queued_from timestamptz;
    saved timestamptz;
BEGIN
    SELECT j.project_id, j.user_name, j.created_at, j.gang_cpus, j.gang_gpus INTO job
    FROM jobs j WHERE j.id = NEW.job_id;
    SELECT max(a.finished_at) INTO queued_from FROM job_attempts a WHERE a.job_id = NEW.job_id AND a.n < NEW.n;
    NEW.queue_s := greatest(0, extract(epoch FROM NEW.created_at - coalesce(queued_from, job.created_at)));
    NEW.starting_s := greatest(0, extract(epoch FROM coalesce(NEW.running_at, NEW.finished_at) - NEW.created_at));
    NEW.lost_s := 0;
    IF NEW.running_at IS NOT NULL AND NEW.status <> 'succeeded' THEN
        SELECT max(c.created_at) INTO saved FROM checkpoints c WHERE c.job_id = NEW.job_id AND c.attempt = NEW.n;
        NEW.lost_s := greatest(
            0, extract(epoch FROM NEW.finished_at - greatest(NEW.running_at, coalesce(saved, NEW.running_at))));
    END IF;
    NEW.productive_s := CASE WHEN NEW.running_at IS NULL THEN 0
        ELSE greatest(0, extract(epoch FROM NEW.finished_at - NEW.running_at) - NEW.lost_s) END;
{upserts}    RETURN NEW;
END $$;
"""

# One rollup row per (project, UTC hour or day, user), added to as each attempt ends.
UPSERT = """
    INSERT INTO usage_{unit}s AS u (project_id, {unit}, user_name, attempts, queue_s,
                                  cpu_starting_s, cpu_productive_s, cpu_lost_s,
                                  gpu_starting_s, gpu_productive_s, gpu_lost_s)
    VALUES (job.project_id, date_trunc('{unit}', NEW.finished_at, 'UTC'), coalesce(job.user_name, ''), 1, NEW.queue_s,
            NEW.starting_s * job.gang_cpus, NEW.productive_s * job.gang_cpus, NEW.lost_s * job.gang_cpus,
            NEW.starting_s * job.gang_gpus, NEW.productive_s * job.gang_gpus, NEW.lost_s * job.gang_gpus)
    ON CONFLICT (project_id, {unit}, user_name) DO UPDATE SET
        attempts = u.attempts + 1, queue_s = u.queue_s + EXCLUDED.queue_s,
        cpu_starting_s = u.cpu_starting_s + EXCLUDED.cpu_starting_s,
        cpu_productive_s = u.cpu_productive_s + EXCLUDED.cpu_productive_s,
        cpu_lost_s = u.cpu_lost_s + EXCLUDED.cpu_lost_s,
        gpu_starting_s = u.gpu_starting_s + EXCLUDED.gpu_starting_s,
        gpu_productive_s = u.gpu_productive_s + EXCLUDED.gpu_productive_s,
        gpu_lost_s = u.gpu_lost_s + EXCLUDED.gpu_lost_s;
"""
ATTEMPT_ENDED = ATTEMPT_ENDED_TEMPLATE.format(upserts="".join(UPSERT.format(unit=unit) for unit in ("hour", "day")))

FIGURES = ("cpu_starting_s", "cpu_productive_s", "cpu_lost_s", "gpu_starting_s", "gpu_productive_s", "gpu_lost_s")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("jobs", sa.Column("user_name", sa.String(length=128), nullable=True))
    op.add_column("job_attempts", sa.Column("running_at", sa.DateTime(timezone=True), nullable=True))
    for column in ("queue_s", "starting_s", "productive_s", "lost_s"):
        op.add_column("job_attempts", sa.Column(column, sa.Double(), nullable=True))
    for unit in ("hour", "day"):
        table = f"usage_{unit}s"
        op.create_table(
            table,
            sa.Column("project_id", sa.UUID(), nullable=False),
            sa.Column(unit, sa.DateTime(timezone=True), nullable=False),
            sa.Column("user_name", sa.String(length=128), server_default=sa.text("''"), nullable=False),
            sa.Column("attempts", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
            sa.Column("queue_s", sa.Double(), server_default=sa.text("0"), nullable=False),
            *(sa.Column(name, sa.Double(), server_default=sa.text("0"), nullable=False) for name in FIGURES),
            sa.ForeignKeyConstraint(
                ["project_id"], ["projects.id"], name=op.f(f"fk_{table}_project_id_projects"), ondelete="CASCADE"
            ),
            sa.PrimaryKeyConstraint("project_id", unit, "user_name", name=op.f(f"pk_{table}")),
        )
        op.create_index(op.f(f"ix_{table}_{unit}"), table, [unit], unique=False)
    op.execute(ATTEMPT_ENDED)
    op.execute(
        "CREATE TRIGGER tm_attempt_ended BEFORE UPDATE OF finished_at ON job_attempts FOR EACH ROW"
        " WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL) EXECUTE FUNCTION tm_attempt_ended()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS tm_attempt_ended ON job_attempts")
    op.execute("DROP FUNCTION IF EXISTS tm_attempt_ended()")
    for unit in ("day", "hour"):
        op.drop_index(op.f(f"ix_usage_{unit}s_{unit}"), table_name=f"usage_{unit}s")
        op.drop_table(f"usage_{unit}s")
    for column in ("lost_s", "productive_s", "starting_s", "queue_s", "running_at"):
        op.drop_column("job_attempts", column)
    op.drop_column("jobs", "user_name")
