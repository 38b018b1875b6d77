"""Reads of `project_storage` (kept by migration 0019's triggers) with each project's quota."""

from __future__ import annotations

import uuid
from typing import NamedTuple

from sqlalchemy import Select, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Project, ProjectStorage


class Stored(NamedTuple):
    project: str
    quota_bytes: int | None
    checkpoint_bytes: int
    checkpoints: int
    code_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.checkpoint_bytes + self.code_bytes


def _stored(*, every_project: bool = True) -> Select[str, int | None, int, int, int]:
    """Each project's figures; `every_project`, with zeros for one that never stored anything (an outer
    join, which FOR UPDATE cannot lock through: `lock` makes the row first)."""
    return (
        select(
            Project.name,
            Project.storage_quota_bytes,
            func.coalesce(ProjectStorage.checkpoint_bytes, 0),
            func.coalesce(ProjectStorage.checkpoints, 0),
            func.coalesce(ProjectStorage.code_bytes, 0),
        )
        .select_from(Project)
        .join(ProjectStorage, ProjectStorage.project_id == Project.id, isouter=every_project)
    )


async def list_stored(session: AsyncSession, project_id: uuid.UUID | None) -> list[Stored]:
    query = _stored().order_by(Project.name)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return [Stored(*row.tuple()) for row in await session.execute(query)]


async def lock(session: AsyncSession, project_id: uuid.UUID) -> Stored:
    """The project's figures, its row locked to the end of the transaction: two checkpoints or uploads
    of one project are judged one after the other, each seeing what the other added."""
    await session.execute(insert(ProjectStorage).values(project_id=project_id).on_conflict_do_nothing())
    query = _stored(every_project=False).where(Project.id == project_id).with_for_update(of=ProjectStorage)
    return Stored(*(await session.execute(query)).one().tuple())
