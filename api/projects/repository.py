from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import ClusterRow, Project, ProjectUsage


class Found(NamedTuple):
    project: Project
    cluster: str
    usage: dict[str, float]  # what its active jobs hold now (CPU, GPU)


def _with_cluster() -> Any:
    return (
        select(Project, ClusterRow.name, func.coalesce(ProjectUsage.cpus, 0), func.coalesce(ProjectUsage.gpus, 0))
        .join(ClusterRow, ClusterRow.id == Project.cluster_id)
        .outerjoin(ProjectUsage, ProjectUsage.project_id == Project.id)
    )


def _found(row: Any) -> Found:
    return Found(row[0], row[1], {"CPU": float(row[2]), "GPU": float(row[3])})


async def find(session: AsyncSession, name: str) -> Found | None:
    """The project, its cluster's name and its usage."""
    row = (await session.execute(_with_cluster().where(Project.name == name))).first()
    return None if row is None else _found(row)


async def list_all(session: AsyncSession, project_id: uuid.UUID | None = None) -> list[Found]:
    query = _with_cluster().order_by(Project.name)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return [_found(row) for row in await session.execute(query)]


async def insert_new(session: AsyncSession, name: str, cluster_id: uuid.UUID, values: dict[str, Any]) -> bool:
    """Whether it was stored (False: the name is taken)."""
    inserted = await session.execute(
        insert(Project)
        .values(id=uuid.uuid4(), name=name, cluster_id=cluster_id, **values)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(Project.id)
    )
    return inserted.scalar_one_or_none() is not None


async def change(session: AsyncSession, project_id: uuid.UUID, values: dict[str, Any]) -> None:
    await session.execute(update(Project).where(Project.id == project_id).values(**values))
