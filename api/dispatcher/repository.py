"""Queries the dispatcher runs: claims in queue order, leases, attempts."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased, selectinload

from api.db.models import ApiToken, Checkpoint, Job, JobAttempt, JobEvent, LogLine, Project, ProjectUsage
from api.jobs.repository import ACTIVE
from trainmaster.models import JobStatus

ADMISSION_LOCK = 0x746D_6164  # "tmad": one admission round at a time across every dispatcher


async def db_now(session: AsyncSession) -> datetime:
    """The database's clock: every time the dispatcher writes or compares comes from here."""
    return (await session.execute(select(func.now()))).scalar_one()


async def lock_admission(session: AsyncSession) -> None:
    """Serialise admission rounds (held until the transaction ends): the resources already held are
    read and added to under this lock, so two dispatchers never admit against the same free capacity."""
    await session.execute(select(func.pg_advisory_xact_lock(ADMISSION_LOCK)))


async def held_resources(session: AsyncSession) -> tuple[float, float]:
    """CPUs and GPUs held by active trainmaster jobs (their placement may not show in Ray yet): the
    sum of `project_usage`, which a trigger keeps equal to the active jobs' gangs."""
    row = (
        await session.execute(
            select(func.coalesce(func.sum(ProjectUsage.cpus), 0), func.coalesce(func.sum(ProjectUsage.gpus), 0))
        )
    ).one()
    return float(row[0]), float(row[1])


async def lock_queued(session: AsyncSession, limit: int) -> list[Job]:
    """Queued jobs in admission order (api/jobs/repository.py says which), locked; rows another dispatcher holds are
    skipped.

    Within one project usage is the same for every job, so the project's jobs come in the admission
    order by (priority, age) alone: the first `limit` of all are among the first `limit` of each
    project. Those are read per project on ix_jobs_queued_by_project with their sort keys (an
    index-only scan), only those narrow rows are sorted, and only the first `limit` are fetched and
    locked, so a round reads projects x limit index entries and `limit` rows however long the queue is."""
    usage = ProjectUsage.__table__
    queued = aliased(Job)
    firsts = (
        select(queued.id, queued.priority, queued.created_at)
        .where(queued.project_id == Project.id, queued.status == JobStatus.queued)
        .order_by(queued.priority.desc(), queued.created_at, queued.id)
        .limit(limit)
        .lateral()
    )
    gpus = func.coalesce(usage.c.gpus, 0).label("gpus")
    cpus = func.coalesce(usage.c.cpus, 0).label("cpus")
    head = (
        select(firsts.c.id, firsts.c.priority, gpus, cpus, firsts.c.created_at)
        .select_from(Project)
        .join(firsts, true())
        .outerjoin(usage, usage.c.project_id == Project.id)
        .order_by(firsts.c.priority.desc(), gpus, cpus, firsts.c.created_at, firsts.c.id)
        .limit(limit)
        .subquery()
    )
    query = (
        select(Job)
        .join(head, head.c.id == Job.id)
        .where(Job.status == JobStatus.queued)
        .order_by(head.c.priority.desc(), head.c.gpus, head.c.cpus, head.c.created_at, head.c.id)
        .with_for_update(of=Job, skip_locked=True)
        .options(selectinload(Job.attempts))
    )
    return list((await session.execute(query)).scalars())


async def claim_active(session: AsyncSession, owner: str, lease_s: float, limit: int = 200) -> list[uuid.UUID]:
    """Take (or renew) the lease of active jobs that are ours or whose lease ran out.

    The least recently renewed come first, so past `limit` active jobs every one is still reached
    in turn: renewing a lease moves the job to the back.
    """
    expires = func.now() + timedelta(seconds=lease_s)
    candidates = (
        select(Job.id)
        .where(
            Job.status.in_(ACTIVE),
            or_(Job.lease_owner == owner, Job.lease_owner.is_(None), Job.lease_expires_at < func.now()),
        )
        .order_by(Job.lease_expires_at.asc().nulls_first(), Job.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    result = await session.execute(
        update(Job)
        .where(Job.id.in_(candidates.scalar_subquery()))
        .values(lease_owner=owner, lease_expires_at=expires)
        .returning(Job.id)
    )
    return [row[0] for row in result.all()]


async def lock_if_leased(session: AsyncSession, job_id: uuid.UUID, owner: str) -> Job | None:
    """The fencing check: the job, locked, only while this dispatcher still holds its lease."""
    found = await lock_leased(session, [job_id], owner)
    return found[0] if found else None


async def lock_leased(session: AsyncSession, job_ids: Sequence[uuid.UUID], owner: str) -> list[Job]:
    """The fencing check for many jobs at once: those of `job_ids` this dispatcher still holds the
    lease of, locked in id order (two transactions locking overlapping sets never deadlock)."""
    query = (
        select(Job)
        .where(Job.id.in_(job_ids), Job.lease_owner == owner)
        .order_by(Job.id)
        .with_for_update()
        .options(selectinload(Job.attempts))
        .execution_options(populate_existing=True)
    )
    return list((await session.execute(query)).scalars())


def latest_attempt(job: Job) -> JobAttempt | None:
    return max(job.attempts, key=lambda a: a.n) if job.attempts else None


async def revoke_job_tokens(session: AsyncSession, job_id: uuid.UUID) -> None:
    await session.execute(
        update(ApiToken).where(ApiToken.job_id == job_id, ApiToken.revoked_at.is_(None)).values(revoked_at=func.now())
    )


async def workers_started(session: AsyncSession, job_id: uuid.UUID, attempt: int) -> bool:
    """Whether the attempt's worker group reported that it started (the `workers_started` event)."""
    return await last_event(session, job_id, attempt, "workers_started") is not None


async def last_event(session: AsyncSession, job_id: uuid.UUID, attempt: int, kind: str) -> JobEvent | None:
    """The attempt's latest event of `kind`, as the job reported it."""
    query = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.kind == kind, JobEvent.data["attempt"].as_integer() == attempt)
        .order_by(JobEvent.id.desc())
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def last_log_lines(session: AsyncSession, job_id: uuid.UUID, attempt: int, limit: int = 200) -> list[str]:
    """The attempt's last stored output lines, oldest first (where a failure's error text is)."""
    query = (
        select(LogLine.line)
        .where(LogLine.job_id == job_id, LogLine.attempt == attempt)
        .order_by(LogLine.seq.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(query)).scalars().all()))


async def checkpoint_since(session: AsyncSession, job_id: uuid.UUID, since: datetime) -> bool:
    """Whether the job registered a checkpoint after `since` (a preempted job saving its work)."""
    query = select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.created_at > since).limit(1)
    return (await session.execute(query)).first() is not None
