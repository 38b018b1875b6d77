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


# A page of one job's lines within a byte budget: PostgreSQL sums the lines' sizes in seq order (or
# backwards, for a tail) and returns the lines while the sum stays within :max_bytes (the first line
# always), so no more than the page is loaded. Plain SQL: the ORM's subquery form cost the API more
# per request than the query itself.
_PAGE = """
    SELECT seq, job_id, attempt, source, line, ts FROM (
        SELECT seq, job_id, attempt, source, line, ts, octet_length(line) AS size,
               sum(octet_length(line)) OVER (ORDER BY seq {order} ROWS UNBOUNDED PRECEDING) AS running
        FROM log_lines WHERE job_id = :job AND seq > :after ORDER BY seq {order} LIMIT :limit
    ) page
    WHERE running <= :max_bytes OR running = size
    ORDER BY seq {order}
"""
_AFTER_WITHIN = select(LogLine).from_statement(text(_PAGE.format(order="ASC")))
_TAIL_WITHIN = select(LogLine).from_statement(text(_PAGE.format(order="DESC")))


async def read_after(
    session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int, max_bytes: int | None = None
) -> list[Any]:
    """The first `limit` lines after `after_seq`; with `max_bytes`, only those whose text fits in it
    (the first line always)."""
    if max_bytes is not None:
        params = {"job": job_id, "after": after_seq, "limit": limit, "max_bytes": max_bytes}
        return list((await session.execute(_AFTER_WITHIN, params)).scalars())
    query = select(LogLine).where(LogLine.job_id == job_id, LogLine.seq > after_seq).order_by(LogLine.seq).limit(limit)
    return list((await session.execute(query)).scalars())


async def read_tail(
    session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int, max_bytes: int | None = None
) -> list[Any]:
    """The last `limit` lines after `after_seq` (with `max_bytes`, the last that fit in it), oldest
    first: a backward walk of ix_log_lines_job_id_seq."""
    if max_bytes is not None:
        params = {"job": job_id, "after": after_seq, "limit": limit, "max_bytes": max_bytes}
        return list(reversed((await session.execute(_TAIL_WITHIN, params)).scalars().all()))
    query = (
        select(LogLine)
        .where(LogLine.job_id == job_id, LogLine.seq > after_seq)
        .order_by(LogLine.seq.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(query)).scalars().all()))


async def any_after(session: AsyncSession, job_id: uuid.UUID, seq: int) -> bool:
    """Whether the job has a stored line after `seq`."""
    query = select(LogLine.seq).where(LogLine.job_id == job_id, LogLine.seq > seq).limit(1)
    return (await session.execute(query)).first() is not None
