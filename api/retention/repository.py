"""Queries behind retention: which finished jobs are due, their stored data in small batches, and
the code packages nothing uses any more."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import CodePackage, Job
from trainmaster.models import JobStatus

RETENTION_LOCK = 0x746D_7274  # "tmrt": one purger at a time across every API replica
TERMINAL = [status for status in JobStatus if status.terminal]


async def try_lock(session: AsyncSession) -> bool:
    """The purge lock until the session's transaction ends, without waiting (another replica purging
    is enough)."""
    return bool((await session.execute(select(func.pg_try_advisory_xact_lock(RETENTION_LOCK)))).scalar_one())


async def expired_jobs(session: AsyncSession, days: float, limit: int) -> list[uuid.UUID]:
    """Finished jobs whose data is still stored and that finished more than `days` ago (database
    clock), the longest finished first (ix_jobs_unpurged_finished_at)."""
    query = (
        select(Job.id)
        .where(
            Job.purged_at.is_(None),
            Job.finished_at.is_not(None),
            Job.finished_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, days * 86400),
            Job.status.in_(TERMINAL),
        )
        .order_by(Job.finished_at)
        .limit(limit)
    )
    return list((await session.execute(query)).scalars())


async def delete_points_or_lines(
    session: AsyncSession, table: str, job_id: uuid.UUID, batch: int, after_seq: int
) -> tuple[int, int]:
    """Delete a job's next `batch` rows after `after_seq` from metric_points or log_lines; how many went
    and the last sequence number deleted. Walking on from there (instead of from the job's first row
    again) keeps each batch from stepping over the index entries of the rows already deleted."""
    assert table in {"metric_points", "log_lines"}
    statement = (
        f"DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} WHERE job_id = :job AND seq > :after"
        " ORDER BY seq LIMIT :batch) RETURNING seq"
    )
    deleted = [
        row[0] for row in await session.execute(text(statement), {"job": job_id, "after": after_seq, "batch": batch})
    ]
    return len(deleted), max(deleted, default=after_seq)


async def delete_small(session: AsyncSession, table: str, job_id: uuid.UUID, batch: int) -> int:
    """Delete up to `batch` of a job's rows from a table with one row per many points (metric_blocks,
    metric_batches); how many went."""
    assert table in {"metric_blocks", "metric_batches"}
    statement = (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE job_id = :job LIMIT :batch))"
    )
    result: Any = await session.execute(text(statement), {"job": job_id, "batch": batch})
    return int(result.rowcount)


async def mark_purged(session: AsyncSession, job_id: uuid.UUID) -> None:
    await session.execute(update(Job).where(Job.id == job_id).values(purged_at=func.now()))


_DELETE_UNUSED_CODE = text(
    """
    DELETE FROM code_packages WHERE (project_id, id) IN (
        SELECT c.project_id, c.id FROM code_packages AS c
        WHERE c.created_at < now() - make_interval(secs => :seconds)
          AND NOT EXISTS (SELECT FROM jobs AS j WHERE j.project_id = c.project_id AND j.spec->>'code' = c.id)
          AND NOT EXISTS (
              SELECT FROM sweeps AS s WHERE s.project_id = c.project_id AND s.request->'spec'->>'code' = c.id
          )
        ORDER BY c.created_at
        LIMIT :limit
        FOR UPDATE OF c SKIP LOCKED
    )
    RETURNING id
    """
)


async def delete_unused_code(session: AsyncSession, days: float, limit: int) -> list[str]:
    """Delete up to `limit` code packages uploaded more than `days` ago (database clock) that no job,
    of any status, and no sweep of their project names; their ids (`sha256:…`)."""
    result = await session.execute(_DELETE_UNUSED_CODE, {"seconds": days * 86400, "limit": limit})
    return [row[0] for row in result]


async def stored_code(session: AsyncSession, code_ids: list[str]) -> set[str]:
    """Which of these packages some project still stores."""
    query = select(CodePackage.id).where(CodePackage.id.in_(code_ids)).distinct()
    return set((await session.execute(query)).scalars())
