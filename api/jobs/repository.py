"""Queries for jobs, their attempts and events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, String, Subquery, cast, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.models import Job, JobEvent, Project
from trainmaster.models import JobStatus


def _with_relations(query: Select[Any]) -> Select[Any]:
    return query.options(selectinload(Job.attempts))


async def insert_job(session: AsyncSession, values: dict[str, Any]) -> uuid.UUID | None:
    """Insert a job; None when the project already holds a job with this idempotency key."""
    statement = (
        insert(Job)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["project_id", "idempotency_key"])
        .returning(Job.id)
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def owned_job_id(session: AsyncSession, job_id: uuid.UUID, project_id: uuid.UUID) -> uuid.UUID | None:
    query = select(Job.id).where(Job.id == job_id, Job.project_id == project_id)
    return (await session.execute(query)).scalar_one_or_none()


async def find_by_idempotency_key(session: AsyncSession, project_id: uuid.UUID, key: str) -> Job | None:
    query = _with_relations(select(Job).where(Job.project_id == project_id, Job.idempotency_key == key))
    return (await session.execute(query)).scalar_one_or_none()


async def get_job(
    session: AsyncSession, job_id: uuid.UUID, project_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Job | None:
    query = _with_relations(select(Job).where(Job.id == job_id))
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    if for_update:
        query = query.with_for_update(of=Job)
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one_or_none()


async def list_jobs(
    session: AsyncSession,
    project_id: uuid.UUID,
    *,
    statuses: Sequence[JobStatus],
    labels: dict[str, str],
    limit: int,
    after: tuple[datetime, uuid.UUID] | None,
    id_prefix: str | None = None,
) -> list[Job]:
    query = _with_relations(select(Job).where(Job.project_id == project_id))
    if id_prefix:
        query = query.where(cast(Job.id, String).startswith(id_prefix, autoescape=True))
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if labels:
        query = query.where(Job.labels.contains(labels))
    if after is not None:
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(*after))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    return list((await session.execute(query)).scalars())


ACTIVE = (JobStatus.starting, JobStatus.running, JobStatus.cancelling)


def admission_order() -> tuple[Subquery, tuple[Any, ...]]:
    """The order the dispatcher admits queued jobs in, and the per-project usage it depends on.

    Priority (high first), then fair share (the project holding the fewest GPUs, then CPUs, in
    active jobs first), then age. Admission and `queue_position` both use this, so the position a
    user sees is the order admission takes.
    """
    usage = (
        select(
            Job.project_id.label("project_id"),
            func.sum(Job.gang_gpus).label("gpus"),
            func.sum(Job.gang_cpus).label("cpus"),
        )
        .where(Job.status.in_(ACTIVE))
        .group_by(Job.project_id)
        .subquery()
    )
    order = (
        Job.priority.desc(),
        func.coalesce(usage.c.gpus, 0),
        func.coalesce(usage.c.cpus, 0),
        Job.created_at,
        Job.id,
    )
    return usage, order


async def queue_positions(session: AsyncSession, jobs: Sequence[Job]) -> dict[uuid.UUID, int]:
    """1-based place in the queue for each queued job, in admission order."""
    wanted = [job.id for job in jobs if job.status is JobStatus.queued]
    if not wanted:
        return {}
    usage, order = admission_order()
    ranked = (
        select(Job.id.label("id"), func.row_number().over(order_by=order).label("position"))
        .outerjoin(usage, usage.c.project_id == Job.project_id)
        .where(Job.status == JobStatus.queued)
        .subquery()
    )
    rows = await session.execute(select(ranked.c.id, ranked.c.position).where(ranked.c.id.in_(wanted)))
    return {job_id: int(position) for job_id, position in rows.all()}


async def list_events(session: AsyncSession, job_id: uuid.UUID) -> list[JobEvent]:
    query = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    return list((await session.execute(query)).scalars())


async def count_by_status(session: AsyncSession) -> dict[JobStatus, int]:
    rows = await session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {status: int(count) for status, count in rows.all()}


async def project_name(session: AsyncSession, project_id: uuid.UUID) -> str:
    return (await session.execute(select(Project.name).where(Project.id == project_id))).scalar_one()
