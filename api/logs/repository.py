from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import LogLine
from api.limits import log_lines
from api.streaming.broker import LOGS_CHANNEL


async def append(
    session: AsyncSession,
    job_id: uuid.UUID,
    attempt: int | None,
    source: str,
    lines: Sequence[str],
    *,
    max_lines: int = 0,
) -> None:
    """Store lines in order (one writer per job at a time, so sequence numbers commit in order), at most
    `max_lines` of the job's in all (0: no limit; api/limits/log_lines.py)."""
    if not lines:
        return
    await session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"l:{job_id}"})
    lines = await log_lines.counts.kept(session, job_id, lines, max_lines)
    if not lines:
        return
    session.add_all(LogLine(job_id=job_id, attempt=attempt, source=source, line=line) for line in lines)
    await session.flush()
    await session.execute(text("SELECT pg_notify(:channel, :job)"), {"channel": LOGS_CHANNEL, "job": str(job_id)})


async def read_after(session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int) -> list[Any]:
    query = select(LogLine).where(LogLine.job_id == job_id, LogLine.seq > after_seq).order_by(LogLine.seq).limit(limit)
    return list((await session.execute(query)).scalars())


async def read_tail(session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int) -> list[Any]:
    """The last `limit` lines after `after_seq`, oldest first: a backward walk of ix_log_lines_job_id_seq."""
    query = (
        select(LogLine)
        .where(LogLine.job_id == job_id, LogLine.seq > after_seq)
        .order_by(LogLine.seq.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(query)).scalars().all()))
