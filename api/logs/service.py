"""Driver and worker output, stored as the job runs (the dispatcher copies it from Ray)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.jobs import service as jobs
from api.logs import repository
from trainmaster.models import LogLine

STREAM_BATCH = 1000


def to_wire(row: Any) -> LogLine:
    return LogLine(seq=row.seq, attempt=row.attempt, source=row.source, line=row.line, ts=row.ts)


async def read(
    session: AsyncSession, principal: Principal, raw_id: str, after_seq: int, limit: int, *, tail: int | None = None
) -> list[LogLine]:
    """Lines after `after_seq`, the first `limit` of them, or with `tail` the last `tail` of them."""
    job = await jobs.get_owned(session, principal, raw_id)
    if tail is not None:
        return [to_wire(row) for row in await repository.read_tail(session, job.id, after_seq, tail)]
    return [to_wire(row) for row in await repository.read_after(session, job.id, after_seq, limit)]


async def read_for_stream(session: AsyncSession, job_id: uuid.UUID, after_seq: int) -> tuple[list[dict[str, Any]], int]:
    rows = await repository.read_after(session, job_id, after_seq, STREAM_BATCH)
    return [to_wire(row).model_dump(mode="json") for row in rows], (rows[-1].seq if rows else after_seq)
