"""Moves a submitted job through its life as the dispatcher does (status machine, attempt rows), without Ray.

The telemetry tests need jobs that were queued, admitted, ran and ended; this writes the same rows the
dispatcher writes, through the one `transition` function, each step in its own transaction.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone

from sqlalchemy import select

from api.db.models import Job, JobAttempt
from api.db.session import create_engine, session_factory
from api.jobs.status import transition
from api.settings import Settings
from trainmaster.models import AttemptStatus, JobStatus


def advance(settings: Settings, job_id: str, target: JobStatus, *, error: str | None = None) -> None:
    """queued → starting (attempt row), starting → running (attempt running), running → a terminal status."""

    async def step() -> None:
        engine = create_engine(settings)
        try:
            async with session_factory(engine)() as session:
                job = (
                    await session.execute(select(Job).where(Job.id == uuid.UUID(job_id)).with_for_update())
                ).scalar_one()
                attempts = (
                    (
                        await session.execute(
                            select(JobAttempt).where(JobAttempt.job_id == job.id).order_by(JobAttempt.n)
                        )
                    )
                    .scalars()
                    .all()
                )
                now = datetime.now(timezone.utc)
                if target is JobStatus.starting:
                    n = len(attempts) + 1
                    session.add(
                        JobAttempt(
                            job_id=job.id, n=n, ray_submission_id=f"tm-{job.id}-{n}", status=AttemptStatus.pending
                        )
                    )
                elif target is JobStatus.running:
                    attempts[-1].status, attempts[-1].started_at = AttemptStatus.running, now
                elif target.terminal:
                    attempts[-1].finished_at = now
                    attempts[-1].status = (
                        AttemptStatus.succeeded if target is JobStatus.succeeded else AttemptStatus.failed
                    )
                    attempts[-1].error = error
                await transition(session, job, target, error=error)
                await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(step())


def exporting(database_url: str) -> bool:
    """Whether some process holds the telemetry export lock on this database (it then follows new rows)."""
    import psycopg

    from api.settings import libpq_url
    from api.telemetry.service import EXPORT_LOCK

    with psycopg.connect(libpq_url(database_url)) as conn:
        row = conn.execute(
            """
            SELECT count(*) FROM pg_locks
            WHERE locktype = 'advisory' AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND ((classid::bigint << 32) | objid::bigint) = %s
            """,
            (EXPORT_LOCK,),
        ).fetchone()
    return bool(row and row[0])
