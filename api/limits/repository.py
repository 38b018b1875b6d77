"""The counts the limits read: each one indexed look-up of one job's or one project's rows, capped at
the limit, so a check costs at most the limit's entries of the writer's own rows and none of another's."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct

# Of a batch's names, those the job (of this project) has not stored: one probe of metric_blocks'
# primary key (job_id, name, …) per name; `found` false when the project has no such job.
NEW_METRIC_NAMES = """
    SELECT EXISTS (SELECT FROM jobs WHERE id = %(job)s AND project_id = %(project)s) AS found,
           coalesce((SELECT array_agg(n.name) FROM unnest(%(names)s::text[]) AS n(name)
                     WHERE NOT EXISTS (SELECT FROM metric_blocks b WHERE b.job_id = %(job)s AND b.name = n.name)),
                    '{}') AS new
"""

# The job's distinct metric names, counted up to %(cap)s by a skip scan of metric_blocks' primary key
# (one probe per name, not one per block).
METRIC_NAMES = """
    WITH RECURSIVE found AS (
        (SELECT name, 1 AS n FROM metric_blocks WHERE job_id = %(job)s ORDER BY name LIMIT 1)
        UNION ALL
        SELECT (SELECT b.name FROM metric_blocks b WHERE b.job_id = %(job)s AND b.name > found.name
                ORDER BY b.name LIMIT 1), found.n + 1
        FROM found WHERE found.name IS NOT NULL AND found.n < %(cap)s
    )
    SELECT count(name) FROM found
"""


async def new_metric_names(
    direct: Direct, job_id: uuid.UUID, project_id: uuid.UUID, names: Collection[str]
) -> list[str] | None:
    """The names the job has not stored yet; None when the project has no such job."""
    row = await direct.one(NEW_METRIC_NAMES, {"job": job_id, "project": project_id, "names": list(names)})
    if row is None or not row[0]:
        return None
    return list(row[1])


async def metric_names(direct: Direct, job_id: uuid.UUID, cap: int) -> int:
    row = await direct.one(METRIC_NAMES, {"job": job_id, "cap": cap})
    return int(row[0]) if row else 0


async def _capped_count(session: AsyncSession, table_rows: str, params: dict[str, object], cap: int) -> int:
    query = f"SELECT count(*) FROM (SELECT 1 FROM {table_rows} LIMIT :cap) capped"
    return int((await session.execute(text(query), {**params, "cap": cap})).scalar_one())


async def events(session: AsyncSession, job_id: uuid.UUID, cap: int) -> int:
    return await _capped_count(session, "job_events WHERE job_id = :job", {"job": job_id}, cap)


async def checkpoints(session: AsyncSession, job_id: uuid.UUID, cap: int) -> int:
    return await _capped_count(session, "checkpoints WHERE job_id = :job", {"job": job_id}, cap)


async def checkpoint_known(session: AsyncSession, job_id: uuid.UUID, path: str) -> bool:
    """A path the job reported before: reported again it stores nothing (kept as first recorded)."""
    query = text("SELECT EXISTS (SELECT FROM checkpoints WHERE job_id = :job AND path = :path)")
    return bool((await session.execute(query, {"job": job_id, "path": path})).scalar_one())


async def lock_checkpoints(session: AsyncSession, job_id: uuid.UUID) -> None:
    """One writer of a job's checkpoints at a time, until commit: two reports at once cannot both take
    the last row the limit allows."""
    await session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"c:{job_id}"})


async def live_tokens(session: AsyncSession, project_id: uuid.UUID, cap: int) -> int:
    """The project's project and metrics tokens neither revoked nor expired (job tokens come and go with
    jobs: the platform mints them, not the tenant)."""
    rows = (
        "api_tokens WHERE project_id = :project AND job_id IS NULL AND revoked_at IS NULL"
        " AND (expires_at IS NULL OR expires_at > now())"
    )
    return await _capped_count(session, rows, {"project": project_id}, cap)


async def lock_tokens(session: AsyncSession, project_id: uuid.UUID) -> None:
    await session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": f"t:{project_id}"})


async def log_lines_after(session: AsyncSession, job_id: uuid.UUID, after_seq: int, cap: int) -> tuple[int, int]:
    """(how many of the job's log lines come after `after_seq`, counted up to `cap`; the job's last seq).
    Called under the job's log lock (api/logs/repository.py append), where seqs commit in order."""
    query = text(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM log_lines WHERE job_id = :job AND seq > :after LIMIT :cap) c),"
        " (SELECT max(seq) FROM log_lines WHERE job_id = :job)"
    )
    count, last = (await session.execute(query, {"job": job_id, "after": after_seq, "cap": cap})).one()
    return int(count), int(last or after_seq)
