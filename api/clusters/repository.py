from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import ClusterRow, Job, Project
from trainmaster.models import JobStatus


async def find(session: AsyncSession, name: str) -> ClusterRow | None:
    return (await session.execute(select(ClusterRow).where(ClusterRow.name == name))).scalar_one_or_none()


async def list_all(session: AsyncSession) -> Sequence[ClusterRow]:
    return (await session.execute(select(ClusterRow).order_by(ClusterRow.name))).scalars().all()


async def insert_new(session: AsyncSession, values: dict[str, Any]) -> ClusterRow | None:
    """The new cluster, or None when the name is taken."""
    inserted = await session.execute(
        insert(ClusterRow).values(**values).on_conflict_do_nothing(index_elements=["name"]).returning(ClusterRow.id)
    )
    if inserted.scalar_one_or_none() is None:
        return None
    return await find(session, values["name"])


async def queued_on_cluster(session: AsyncSession, cluster_id: uuid.UUID) -> int:
    """Jobs queued in every project that runs on the cluster."""
    on_cluster = Job.project_id.in_(select(Project.id).where(Project.cluster_id == cluster_id))
    return await _queued(session, on_cluster)


async def queued_in_project(session: AsyncSession, project_id: uuid.UUID) -> int:
    return await _queued(session, Job.project_id == project_id)


async def _queued(session: AsyncSession, where: Any) -> int:
    queued = select(func.count()).select_from(Job).where(Job.status == JobStatus.queued, where)
    return int((await session.execute(queued)).scalar_one())
