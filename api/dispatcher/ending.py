"""How an attempt's end is written (reconcile.py): no lease, no preemption pending, no job token
left, then the status. repository.FAIL_LAUNCHES does the same for many launches in one statement."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job
from api.dispatcher import repository as repo
from api.jobs.status import transition
from trainmaster.models import JobStatus


async def release(session: AsyncSession, job: Job) -> None:
    """The attempt is over: no lease, no preemption pending, no cap on its size, no job token left."""
    job.lease_owner = None
    job.lease_expires_at = None
    job.preempted_by = job.preempt_requested_at = None
    job.shrink_to = job.shrink_requested_at = None  # a shrunk gang's next attempt may grow to its max
    await repo.revoke_job_tokens(session, job.id)


async def finish(session: AsyncSession, job: Job, status: JobStatus, error: str | None, message: str) -> None:
    await release(session, job)
    await transition(session, job, status, message=message, error=error)
