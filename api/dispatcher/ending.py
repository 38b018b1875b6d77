"""How an attempt's end is written, shared by launch.py (a launch that can never be made) and
reconcile.py (everything else): no lease, no preemption pending, no job token left, then the status."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobAttempt
from api.dispatcher import repository as repo
from api.jobs.status import transition
from trainmaster.models import AttemptStatus, JobStatus


async def release(session: AsyncSession, job: Job) -> None:
    """The attempt is over: no lease, no preemption pending, no job token left."""
    job.lease_owner = None
    job.lease_expires_at = None
    job.preempted_by = job.preempt_requested_at = None
    await repo.revoke_job_tokens(session, job.id)


async def finish(session: AsyncSession, job: Job, status: JobStatus, error: str | None, message: str) -> None:
    await release(session, job)
    await transition(session, job, status, message=message, error=error)


async def fail_launch(session: AsyncSession, job: Job, attempt: JobAttempt, now: datetime, error: str) -> None:
    """A launch that can never be made (its code package, its runtime environment, Ray calling it
    invalid): the attempt and the job fail with `error`, no retry, since each would meet the same.
    A job being cancelled ends cancelled."""
    attempt.status, attempt.finished_at, attempt.error = AttemptStatus.failed, now, error
    if job.status is JobStatus.cancelling:
        await finish(session, job, JobStatus.cancelled, None, "cancelled before launch")
        return
    await finish(session, job, JobStatus.failed, error, f"attempt {attempt.n} could not be launched: {error}")
