"""Runs the queue's statements (sql.py): the claim of a round's batch, a new job's place, the places of
a page or of one job, a group's ranks, and each project's queue as `GET /v1/queues` shows it."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import OnSession, Runner
from api.db.models import Job, Project, ProjectUsage, QueueCount
from api.queues import sql
from api.queues.ranks import Older
from trainmaster.models import JobStatus

NEWER_CAP = 1000  # a group with fewer jobs at or after one counts those, not the ones before (older_in_group)


class QueuedJob(NamedTuple):
    """A queued job as an admission round reads it (CLAIM): plain values, no ORM object (a round reads up
    to `admit_batch` of them and writes its decisions back in one statement)."""

    id: uuid.UUID
    project_id: uuid.UUID
    name: str
    spec: dict[str, Any]
    priority: int
    gang_cpus: float
    gang_gpus: float
    pending_reason: str | None
    infeasible_since: datetime | None
    created_at: datetime
    bypassed_since: datetime | None
    share: float  # its project's fair share with the gangs of its project ahead of it: order.admission_key
    attempts: int  # the highest attempt number so far, 0 for none


async def lock_queued(
    session: AsyncSession, limit: int, cluster: uuid.UUID | None = None, seen: Iterable[uuid.UUID] = ()
) -> list[QueuedJob]:
    """The cluster's first `limit` queued jobs in admission order, each with its progressive share,
    locked, of the projects not in `seen` (the round's earlier batches: decide.read_on); rows another
    dispatcher holds are skipped."""
    params = {"limit": limit, "cluster": cluster, "seen": list(seen)}
    return [QueuedJob(*row) for row in await OnSession(session).all(sql.CLAIM, params)]


async def insert_queued(runner: Runner, values: dict[str, Any], channel: str, payload: str) -> tuple[Any, ...] | None:
    """Insert a queued job with its `submitted` event and notify `channel`; its (id, created_at, spec as
    stored: JSONB orders keys its own way, and every later read answers in that order, queue position),
    or None when the project already holds a job with this idempotency key (nothing is written then).
    On a direct connection the statement commits as a whole when it returns."""
    return await runner.one(sql.INSERT_QUEUED, {**values, "channel": channel, "payload": payload})


async def queue_positions(session: AsyncSession, jobs: Sequence[Job]) -> dict[uuid.UUID, int]:
    """1-based place in the queue for each queued job, in admission order (sql.QUEUE_POSITIONS)."""
    return await queue_positions_of(session, [job.id for job in jobs if job.status is JobStatus.queued])


async def queue_positions_of(
    session: AsyncSession, queued_ids: Sequence[uuid.UUID], *, newer_cap: int = NEWER_CAP
) -> dict[uuid.UUID, int]:
    if not queued_ids:
        return {}
    rows = await OnSession(session).all(sql.QUEUE_POSITIONS, {"ids": list(queued_ids), "newer_cap": newer_cap})
    return {job_id: int(position) for job_id, position in rows}


async def read_job(
    runner: Runner, job_id: uuid.UUID, project_id: uuid.UUID, older: Older | None = None, *, newer_cap: int = NEWER_CAP
) -> tuple[Any, ...] | None:
    """The row sql.READ_JOB reads (its columns in that order), or None when the project holds no such
    job. `older`: the job's own group's older queued jobs and their gangs, when known (ranks.py)."""
    count, cpus, gpus = older if older is not None else (None, None, None)
    params = {"id": job_id, "project_id": project_id, "newer_cap": newer_cap}
    params |= {"older": count, "older_cpus": cpus, "older_gpus": gpus}
    return await runner.one(sql.READ_JOB, params)


async def group_ranks(runner: Runner, project_id: uuid.UUID, priority: int, limit: int) -> list[tuple[int, str, Older]]:
    """(created µs, id, its Older) for the oldest `limit` queued jobs of a group (sql.GROUP_RANKS)."""
    rows = await runner.all(sql.GROUP_RANKS, {"project_id": project_id, "priority": priority, "limit": limit})
    return [(int(created_us), job_id, (int(n), int(cpus), int(gpus))) for created_us, job_id, n, cpus, gpus in rows]


class ProjectRow(NamedTuple):
    project: Project
    cpus: float  # what its active jobs hold
    gpus: float
    waiting: int  # its queued jobs (the maintained counts: no scan of the queue)
    share: float  # its fair share, the admission order's key among equal priorities


async def projects_of(session: AsyncSession, cluster: uuid.UUID) -> list[ProjectRow]:
    """Each project of the cluster, as `ProjectRow` says."""
    waiting = (
        select(func.coalesce(func.sum(QueueCount.queued), 0))
        .where(QueueCount.project_id == Project.id)
        .correlate(Project)
        .scalar_subquery()
    )
    query = (
        select(
            Project,
            func.coalesce(ProjectUsage.cpus, 0),
            func.coalesce(ProjectUsage.gpus, 0),
            waiting,
            func.coalesce(ProjectUsage.share, 0),
        )
        .outerjoin(ProjectUsage, ProjectUsage.project_id == Project.id)
        .where(Project.cluster_id == cluster)
        .order_by(Project.name)
    )
    return [
        ProjectRow(row[0], float(row[1]), float(row[2]), int(row[3]), float(row[4]))
        for row in await session.execute(query)
    ]


async def first_queued(session: AsyncSession, project_ids: list[uuid.UUID], limit: int) -> list[Any]:
    """The first `limit` queued jobs of each project, in its admission order (priority, then age), on
    ix_jobs_queued_by_project."""
    if not project_ids:
        return []
    ranked = (
        select(
            Job.id,
            Job.project_id,
            Job.name,
            Job.priority,
            Job.pending_reason,
            func.row_number()
            .over(partition_by=Job.project_id, order_by=(Job.priority.desc(), Job.created_at, Job.id))
            .label("place"),
        )
        .where(Job.status == JobStatus.queued, Job.project_id.in_(project_ids))
        .subquery()
    )
    query = select(ranked).where(ranked.c.place <= limit).order_by(ranked.c.project_id, ranked.c.place)
    return list((await session.execute(query)).all())
