from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Checkpoint


async def record(
    session: AsyncSession, job_id: uuid.UUID, attempt: int | None, path: str, step: int | None, metrics: dict[str, Any]
) -> None:
    await session.execute(
        insert(Checkpoint)
        .values(job_id=job_id, attempt=attempt, path=path, step=step, metrics=metrics)
        .on_conflict_do_nothing(index_elements=["job_id", "path"])
    )


async def list_for_job(session: AsyncSession, job_id: uuid.UUID) -> list[Checkpoint]:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.id)
    return list((await session.execute(query)).scalars())


async def set_pinned(session: AsyncSession, job_id: uuid.UUID, checkpoint_id: int, pinned: bool) -> Checkpoint | None:
    """The checkpoint with `pinned` set, when it exists and is not deleted; else as it is (or None)."""
    changed = (
        update(Checkpoint)
        .where(Checkpoint.job_id == job_id, Checkpoint.id == checkpoint_id, Checkpoint.deleted_at.is_(None))
        .values(pinned=pinned)
        .returning(Checkpoint)
    )
    row = (await session.execute(changed)).scalar_one_or_none()
    if row is not None:
        return row
    found = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.id == checkpoint_id)
    return (await session.execute(found)).scalar_one_or_none()
