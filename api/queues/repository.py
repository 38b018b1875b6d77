from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, Project, ProjectUsage, QueueCount
from trainmaster.models import JobStatus


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
