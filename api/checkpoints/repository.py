from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
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


async def find_for_update(session: AsyncSession, job_id: uuid.UUID, checkpoint_id: int) -> Checkpoint | None:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.id == checkpoint_id).with_for_update()
    return (await session.execute(query)).scalar_one_or_none()
