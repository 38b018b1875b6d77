from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

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


async def read_after(
    session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int, max_bytes: int | None = None
) -> list[Any]:
    """The first `limit` lines after `after_seq`; with `max_bytes`, only those whose text fits in it
    (the first line always): PostgreSQL sums the sizes, so no more than the page is ever loaded."""
    query = select(LogLine).where(LogLine.job_id == job_id, LogLine.seq > after_seq).order_by(LogLine.seq).limit(limit)
    return list((await session.execute(_within(query, max_bytes))).scalars())


async def read_tail(
    session: AsyncSession, job_id: uuid.UUID, after_seq: int, limit: int, max_bytes: int | None = None
) -> list[Any]:
    """The last `limit` lines after `after_seq` (with `max_bytes`, the last that fit in it), oldest
    first: a backward walk of ix_log_lines_job_id_seq."""
    query = (
        select(LogLine)
        .where(LogLine.job_id == job_id, LogLine.seq > after_seq)
        .order_by(LogLine.seq.desc())
        .limit(limit)
    )
    rows = (await session.execute(_within(query, max_bytes, descending=True))).scalars().all()
    return list(reversed(rows))


async def any_after(session: AsyncSession, job_id: uuid.UUID, seq: int) -> bool:
    """Whether the job has a stored line after `seq`."""
    query = select(LogLine.seq).where(LogLine.job_id == job_id, LogLine.seq > seq).limit(1)
    return (await session.execute(query)).first() is not None


def _within(query: Select[Any], max_bytes: int | None, *, descending: bool = False) -> Select[Any]:
    """`query`'s rows, in seq order (or reversed), while the bytes of the lines before each stay under
    `max_bytes`."""
    if max_bytes is None:
        return query
    size = func.octet_length(LogLine.line)
    order = LogLine.seq.desc() if descending else LogLine.seq
    page = query.add_columns(func.sum(size).over(order_by=order).label("running"), size.label("size")).subquery()
    row = aliased(LogLine, page)
    return (
        select(row)
        .where(or_(page.c.running <= max_bytes, page.c.running == page.c.size))  # the first line always
        .order_by(page.c.seq.desc() if descending else page.c.seq)
    )
