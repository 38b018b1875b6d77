"""Reads of usage: the hourly rollups (usage_hours) for projects and users, ended attempts joined to
their jobs for jobs and labels. Each row: (key, period, attempts, queue_s, then CPU and GPU
starting, productive and lost resource-seconds)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

FIGURES = "cpu_starting_s, cpu_productive_s, cpu_lost_s, gpu_starting_s, gpu_productive_s, gpu_lost_s"
SUMS = ", ".join(f"sum({name}) AS {name}" for name in ("attempts", "queue_s", *FIGURES.split(", ")))

# Projects and users: the rollups, whole days [day_from, day_to) from usage_days and the hours of the
# range's partial days ([start, day_from) and [day_to, end)) from usage_hours, each on its time index:
# at most projects x users x (days + 48) rows, whatever the attempts.
ROLLUP = """
    WITH u AS (
        SELECT project_id, user_name, day AS at, {columns} FROM usage_days
        WHERE day >= :day_from AND day < :day_to
        UNION ALL
        SELECT project_id, user_name, hour AS at, {columns} FROM usage_hours
        WHERE (hour >= :start AND hour < :day_from) OR (hour >= :day_to AND hour < :end)
    )
    SELECT {name} AS key, g.period, g.attempts, g.queue_s, g.cpu_starting_s, g.cpu_productive_s, g.cpu_lost_s,
           g.gpu_starting_s, g.gpu_productive_s, g.gpu_lost_s
    FROM (
        SELECT {key} AS key, {period} AS period, {sums}
        FROM u WHERE CAST(:project AS uuid) IS NULL OR u.project_id = :project
        GROUP BY 1, 2
    ) g {join}
    ORDER BY 2 NULLS FIRST, 1
"""
COLUMNS = "attempts, queue_s, " + FIGURES

# Jobs and labels: the attempts that ended in the range, of one project's jobs (its jobs' index, then
# each job's attempts on their (job_id, n) key), weighted by each job's gang.
ATTEMPTS = """
    SELECT {key} AS key, {period} AS period, count(*), sum(a.queue_s),
           sum(a.starting_s * j.gang_cpus), sum(a.productive_s * j.gang_cpus), sum(a.lost_s * j.gang_cpus),
           sum(a.starting_s * j.gang_gpus), sum(a.productive_s * j.gang_gpus), sum(a.lost_s * j.gang_gpus)
    FROM jobs j JOIN job_attempts a ON a.job_id = j.id
    WHERE j.project_id = :project AND a.finished_at >= :start AND a.finished_at < :end AND a.lost_s IS NOT NULL
    GROUP BY 1, 2 ORDER BY 2 NULLS FIRST, 1
    LIMIT :limit
"""


def _period(column: str, granularity: str | None) -> str:
    return f"date_trunc('{granularity}', {column}, 'UTC')" if granularity in ("hour", "day") else "NULL::timestamptz"


def _days(start: datetime, end: datetime, granularity: str | None) -> tuple[datetime, datetime]:
    """The whole UTC days inside [start, end) (none for hourly periods: then end, end)."""
    first = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if first < start:
        first += timedelta(days=1)
    last = end.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "hour" or first >= last:
        return end, end
    return first, last


async def rollup(
    session: AsyncSession,
    group_by: str,
    start: datetime,
    end: datetime,
    granularity: str | None,
    project: uuid.UUID | None,
) -> list[Any]:
    # Grouped by the project's id (a narrow key, hashed), its name joined to the grouped rows only.
    key, name, join = (
        ("u.project_id", "p.name", "JOIN projects p ON p.id = g.key")
        if group_by == "project"
        else ("u.user_name", "g.key", "")
    )
    query = ROLLUP.format(
        key=key, name=name, join=join, period=_period("u.at", granularity), sums=SUMS, columns=COLUMNS
    )
    day_from, day_to = _days(start, end, granularity)
    params = {"start": start, "end": end, "day_from": day_from, "day_to": day_to, "project": project}
    return list((await session.execute(text(query), params)).all())


async def by_attempts(
    session: AsyncSession,
    label: str | None,
    start: datetime,
    end: datetime,
    granularity: str | None,
    project: uuid.UUID,
    limit: int,
) -> list[Any]:
    key = "coalesce(j.labels ->> CAST(:label AS text), '')" if label is not None else "CAST(j.id AS text)"
    query = ATTEMPTS.format(key=key, period=_period("a.finished_at", granularity))
    params: dict[str, Any] = {"start": start, "end": end, "project": project, "limit": limit}
    if label is not None:
        params["label"] = label
    return list((await session.execute(text(query), params)).all())
