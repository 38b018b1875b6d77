from __future__ import annotations

import json

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.checkpoints import repository
from api.jobs import service as jobs
from trainmaster.models import CheckpointIn, CheckpointInfo


async def record(
    session: AsyncSession, principal: Principal, raw_id: str, checkpoint: CheckpointIn, attempt: int | None
) -> None:
    job = await jobs.get_writable(session, principal, raw_id)
    metrics = json.loads(json.dumps(checkpoint.metrics, default=str))
    await repository.record(session, job.id, attempt, checkpoint.path, checkpoint.step, metrics)


async def list_for_job(session: AsyncSession, principal: Principal, raw_id: str) -> list[CheckpointInfo]:
    job = await jobs.get_owned(session, principal, raw_id)
    return [
        CheckpointInfo(
            id=row.id, attempt=row.attempt, path=row.path, step=row.step, metrics=row.metrics, created_at=row.created_at
        )
        for row in await repository.list_for_job(session, job.id)
    ]
