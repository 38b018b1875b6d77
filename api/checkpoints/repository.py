from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Text, cast, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api import pages
from api.db.models import Checkpoint
from trainmaster.models import CheckpointIn


async def record(
    session: AsyncSession,
    job_id: uuid.UUID,
    attempt: int | None,
    checkpoint: CheckpointIn,
    metrics: dict[str, Any],
    refused: str | None,
) -> bool:
    """Whether it is new (a path reported again is kept as first recorded). A refused one is recorded
    deleted, with why."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "attempt": attempt,
        "path": checkpoint.path,
        "step": checkpoint.step,
        "metrics": metrics,
        "size_bytes": checkpoint.size_bytes,
    }
    if refused is not None:
        values |= {"deleted_at": func.now(), "deleted_why": refused}
    inserted = await session.execute(
        insert(Checkpoint)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["job_id", "path"])
        .returning(Checkpoint.id)
    )
    return inserted.scalar_one_or_none() is not None


async def list_for_job(
    session: AsyncSession, job_id: uuid.UUID, *, after_id: int, limit: int, max_bytes: int
) -> tuple[list[Checkpoint], bool]:
    """A page of the job's checkpoints after `after_id` (api/pages.py), with whether more follow."""
    size = func.octet_length(Checkpoint.path) + func.octet_length(cast(Checkpoint.metrics, Text))
    where = [Checkpoint.job_id == job_id]
    return await pages.after_key(
        session, Checkpoint, where, Checkpoint.id, size, after=after_id, limit=limit, max_bytes=max_bytes
    )


async def find_for_update(session: AsyncSession, job_id: uuid.UUID, checkpoint_id: int) -> Checkpoint | None:
    query = select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.id == checkpoint_id).with_for_update()
    return (await session.execute(query)).scalar_one_or_none()
