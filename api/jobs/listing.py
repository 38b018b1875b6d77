"""The pages a project reads of its jobs and of a job's events: bounded in rows and in bytes of stored
text (api/pages.py), so what one request makes the API build does not grow with what a tenant stored."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import String, Text, cast, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from api import pages
from api.db.models import Job, JobEvent
from api.jobs.repository import with_relations
from trainmaster.models import JobStatus


async def list_jobs(
    session: AsyncSession,
    project_id: uuid.UUID,
    *,
    statuses: Sequence[JobStatus],
    labels: dict[str, str],
    limit: int,
    after: tuple[datetime, uuid.UUID] | None,
    id_prefix: str | None = None,
    max_bytes: int | None = None,
) -> tuple[list[Job], bool]:
    """The page's jobs, newest first: at most `limit`, and with `max_bytes` only those whose stored
    spec and labels fit in it (the first always), with whether the byte bound left some of the `limit`
    out. One statement: PostgreSQL sums the sizes in page order and returns the rows within the
    budget and the first past it (so its caller knows the page was cut), which is dropped here."""
    where = [Job.project_id == project_id]
    if id_prefix:
        where.append(cast(Job.id, String).startswith(id_prefix, autoescape=True))
    if statuses:
        where.append(Job.status.in_(statuses))
    if labels:
        where.append(Job.labels.contains(labels))
    if after is not None:
        where.append(tuple_(Job.created_at, Job.id) < tuple_(*after))
    order = (Job.created_at.desc(), Job.id.desc())
    if max_bytes is None:
        query = with_relations(select(Job).where(*where)).order_by(*order).limit(limit)
        return list((await session.execute(query)).scalars()), False
    # Their text's length, not pg_column_size: that is the compressed size, and the page holds the text.
    size = func.octet_length(cast(Job.spec, Text)) + func.octet_length(cast(Job.labels, Text))
    running = func.sum(size).over(order_by=order, rows=(None, 0))
    sized = (
        select(Job.id, size.label("size"), running.label("running")).where(*where).order_by(*order).limit(limit)
    ).subquery()
    query = (
        with_relations(select(Job, sized.c.running))
        .join(sized, sized.c.id == Job.id)
        .where(sized.c.running - sized.c.size <= max_bytes)
        .order_by(*order)
    )
    rows = (await session.execute(query)).all()
    if len(rows) > 1 and rows[-1].running > max_bytes:
        return [row[0] for row in rows[:-1]], True
    return [row[0] for row in rows], False


async def list_events(
    session: AsyncSession, job_id: uuid.UUID, *, after_id: int, limit: int, max_bytes: int
) -> tuple[list[JobEvent], bool]:
    """A page of the job's events after `after_id` (api/pages.py), with whether more follow."""
    size = func.octet_length(cast(JobEvent.data, Text)) + func.coalesce(func.octet_length(JobEvent.message), 0)
    where = [JobEvent.job_id == job_id]
    return await pages.after_key(
        session, JobEvent, where, JobEvent.id, size, after=after_id, limit=limit, max_bytes=max_bytes
    )
