"""Queries for jobs and their attempts (a job's place in the queue: api/queues/)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.direct import Runner
from api.db.models import Job, Project
from trainmaster.models import JobStatus


def with_relations(query: Select[Any]) -> Select[Any]:
    return query.options(selectinload(Job.attempts))


IDEMPOTENT_MATCH = "SELECT id, request_hash FROM jobs WHERE project_id = %(project)s AND idempotency_key = %(key)s"


async def idempotent_match(runner: Runner, project_id: uuid.UUID, key: str) -> tuple[Any, ...] | None:
    """(id, request hash) of the project's job submitted with this idempotency key."""
    return await runner.one(IDEMPOTENT_MATCH, {"project": project_id, "key": key})


async def get_job(
    session: AsyncSession, job_id: uuid.UUID, project_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Job | None:
    query = with_relations(select(Job).where(Job.id == job_id))
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if for_update:
        query = query.with_for_update(of=Job)
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one_or_none()


ACTIVE = (JobStatus.starting, JobStatus.running, JobStatus.cancelling)


async def project_name_and_max_priority(session: AsyncSession, project_id: uuid.UUID) -> tuple[str, int]:
    query = select(Project.name, Project.max_priority).where(Project.id == project_id)
    name, max_priority = (await session.execute(query)).one()
    return name, max_priority
