"""The fencing check that every dispatcher write after a claim goes through.

A dispatcher holds a job while its lease (`lease_owner`, `lease_expires_at`) is its own. One that
stalled past its lease may wake up after another took the job over: `leased` then yields None and
the stalled one changes nothing. Given a submission id, it also yields None once that attempt is no
longer the job's latest (a retry replaced it while Ray was being asked about the old one).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.db.models import Job, JobAttempt
from api.dispatcher import repository


@dataclass
class Held:
    """A job locked under this dispatcher's lease, with its latest attempt, inside one transaction."""

    session: AsyncSession
    job: Job
    attempt: JobAttempt | None
    now: datetime  # the database's clock, read in this transaction


@asynccontextmanager
async def leased(
    sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID, owner: str, submission_id: str | None = None
) -> AsyncIterator[Held | None]:
    async with sessions() as session, session.begin():
        job = await repository.lock_if_leased(session, job_id, owner)
        attempt = repository.latest_attempt(job) if job is not None else None
        stale = submission_id is not None and (attempt is None or attempt.ray_submission_id != submission_id)
        yield None if job is None or stale else Held(session, job, attempt, await repository.db_now(session))


@asynccontextmanager
async def leased_many(
    sessions: async_sessionmaker[AsyncSession], submissions: Mapping[uuid.UUID, str], owner: str
) -> AsyncIterator[list[Held]]:
    """`leased` for many jobs in one transaction (job id -> the submission id it must still have as
    its latest attempt): only the jobs that pass the same checks are yielded, the rest left out."""
    async with sessions() as session, session.begin():
        jobs = await repository.lock_leased(session, list(submissions), owner)
        now = await repository.db_now(session) if jobs else None
        held = []
        for job in jobs:
            attempt = repository.latest_attempt(job)
            if attempt is not None and attempt.ray_submission_id == submissions[job.id] and now is not None:
                held.append(Held(session, job, attempt, now))
        yield held
