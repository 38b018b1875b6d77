from __future__ import annotations

import json

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.checkpoints import repository
from api.db.models import Checkpoint
from api.errors import Conflict, NotFound
from api.jobs import service as jobs
from api.jobs.status import record_event
from api.limits.service import WriteLimits
from api.storage import service as storage
from trainmaster.models import CheckpointIn, CheckpointInfo, CheckpointList


class CheckpointNotFound(NotFound):
    pass


class CheckpointDeleted(Conflict):
    """A deleted checkpoint cannot be pinned: its files are gone."""


async def record(
    session: AsyncSession,
    principal: Principal,
    raw_id: str,
    checkpoint: CheckpointIn,
    attempt: int | None,
    limits: WriteLimits,
) -> str | None:
    """Records the checkpoint; over its project's storage quota it is recorded as deleted, with an
    event on the job, and the refusal is returned (the caller answers 507 and the job removes its files).
    Past the job's checkpoint rows (a new path), 429 and nothing is written."""
    job = await jobs.get_writable(session, principal, raw_id)
    await limits.check_checkpoint(session, job.id, checkpoint.path)
    metrics = json.loads(json.dumps(checkpoint.metrics, default=str))
    refused = await storage.refusal(session, job.project_id, checkpoint.size_bytes or 0, "this checkpoint")
    stored = await repository.record(
        session, job.id, attempt, checkpoint, metrics, None if refused is None else f"refused: {refused}"
    )
    if refused is not None and stored:
        data = {"path": checkpoint.path, "step": checkpoint.step, "size_bytes": checkpoint.size_bytes}
        await record_event(session, job, "checkpoint_refused", f"checkpoint not kept: {refused}", data)
    return refused


async def list_for_job(
    session: AsyncSession, principal: Principal, raw_id: str, *, after_id: int, limit: int, max_bytes: int
) -> CheckpointList:
    """A page of the job's checkpoints, oldest first: at most `limit`, at most `max_bytes` of paths and
    metrics; `next_after_id` says where the next starts."""
    job = await jobs.get_owned(session, principal, raw_id)
    rows, more = await repository.list_for_job(session, job.id, after_id=after_id, limit=limit, max_bytes=max_bytes)
    return CheckpointList(items=[to_wire(row) for row in rows], next_after_id=rows[-1].id if more else None)


async def pin(
    session: AsyncSession, principal: Principal, raw_id: str, checkpoint_id: int, pinned: bool
) -> CheckpointInfo:
    """Pin (kept whatever the job's policy and its project's retention say) or unpin a checkpoint."""
    job = await jobs.get_owned(session, principal, raw_id)
    row = await repository.find_for_update(session, job.id, checkpoint_id)  # the collector's pass skips it
    if row is None:
        raise CheckpointNotFound(f"job {raw_id} has no checkpoint {checkpoint_id}: list them with GET .../checkpoints")
    if row.deleted_at is not None and pinned:
        raise CheckpointDeleted(f"checkpoint {checkpoint_id} was deleted ({row.deleted_why}): there is nothing to pin")
    row.pinned = pinned
    return to_wire(row)


def to_wire(row: Checkpoint) -> CheckpointInfo:
    return CheckpointInfo.model_validate(row, from_attributes=True)
