from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Cluster, Project


def _with_cluster() -> Any:
    return select(Project, Cluster.name).join(Cluster, Cluster.id == Project.cluster_id)


async def find(session: AsyncSession, name: str) -> tuple[Project, str] | None:
    """The project and its cluster's name."""
    row = (await session.execute(_with_cluster().where(Project.name == name))).first()
    return None if row is None else (row[0], row[1])


async def list_all(session: AsyncSession, project_id: uuid.UUID | None = None) -> list[tuple[Project, str]]:
    query = _with_cluster().order_by(Project.name)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return [(row[0], row[1]) for row in await session.execute(query)]


async def insert_new(session: AsyncSession, name: str, cluster_id: uuid.UUID, max_priority: int) -> bool:
    """Whether it was stored (False: the name is taken)."""
    inserted = await session.execute(
        insert(Project)
        .values(id=uuid.uuid4(), name=name, cluster_id=cluster_id, max_priority=max_priority)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(Project.id)
    )
    return inserted.scalar_one_or_none() is not None


async def change(session: AsyncSession, project_id: uuid.UUID, values: dict[str, Any]) -> None:
    await session.execute(update(Project).where(Project.id == project_id).values(**values))
