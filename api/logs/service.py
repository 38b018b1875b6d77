"""Driver and worker output, stored as the job runs (the dispatcher copies it from Ray)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.jobs import service as jobs
from api.logs import repository
from trainmaster.models import LogLine, LogList

STREAM_BATCH = 1000
STREAM_BATCH_BYTES = 1024 * 1024  # a stream's read holds at most this much text, whatever the lines' sizes


def to_wire(row: Any) -> LogLine:
    return LogLine(seq=row.seq, attempt=row.attempt, source=row.source, line=row.line, ts=row.ts)


async def read(
    session: AsyncSession,
    principal: Principal,
    raw_id: str,
    after_seq: int,
    limit: int,
    *,
    tail: int | None = None,
    max_bytes: int | None = None,
) -> LogList:
    """Lines after `after_seq`, the first `limit` of them, or with `tail` the last `tail` of them; at
    most `max_bytes` of text (the first line always). A page that may not be the last says where the
    next one starts (`next_after_seq`): it stopped at `limit` or at the byte budget."""
    job = await jobs.get_owned(session, principal, raw_id)
    if tail is not None:
        rows = await repository.read_tail(session, job.id, after_seq, tail, max_bytes)
        return LogList(items=[to_wire(row) for row in rows])
    rows = await repository.read_after(session, job.id, after_seq, limit, max_bytes)
    more = bool(rows) and (len(rows) == limit or await repository.any_after(session, job.id, rows[-1].seq))
    return LogList(items=[to_wire(row) for row in rows], next_after_seq=rows[-1].seq if more else None)


async def read_for_stream(session: AsyncSession, job_id: uuid.UUID, after_seq: int) -> tuple[list[dict[str, Any]], int]:
    rows = await repository.read_after(session, job_id, after_seq, STREAM_BATCH, STREAM_BATCH_BYTES)
    return [to_wire(row).model_dump(mode="json") for row in rows], (rows[-1].seq if rows else after_seq)
