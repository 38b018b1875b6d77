"""The jobs table vacuumed as it changes, not once a fifth of it has: queue positions count index-only

Revision ID: 0007_jobs_autovacuum
Revises: 0006_auth_notify
Create Date: 2026-12-04 09:00:00

A job's queue position counts the queued jobs ahead of it in its class on ix_jobs_queued_by_project
(api/jobs/repository.py, QUEUE_POSITIONS). That count reads only the index while the visibility map
says the pages of those jobs are all-visible; queued jobs are the newest rows, and PostgreSQL's
defaults vacuum (and set those bits) only after 20% of the table has been inserted or updated: at a
million rows, never while the jobs are queued, so every count would also visit nearly every queued
job's heap row, about doubling its time (bench/README.md).
Here autovacuum visits the jobs table after 1,000 new or changed rows whatever its size (a vacuum of
a big table reads only the pages not yet all-visible).

Online: ALTER TABLE ... SET (storage parameters) takes SHARE UPDATE EXCLUSIVE, which does not block
reads or writes, and changes the catalog only.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007_jobs_autovacuum"
down_revision: str | None = "0006_auth_notify"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTINGS = {
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "1000",
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
}


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    options = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    op.execute(f"ALTER TABLE jobs SET ({options})")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"ALTER TABLE jobs RESET ({', '.join(SETTINGS)})")
