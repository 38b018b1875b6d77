"""The queries behind every platform figure: all of them read jobs and job_events, never the dispatcher.

Figures come from the database's own timestamps (`job_events.created_at`, the jobs' start and finish),
so every API replica and dispatcher reports the same numbers and none has to be hooked into admission.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# One row per observation, from the status events: how long a job waited in the queue (queued, at
# submit or at a retry, until admitted), how long an admitted gang took to run (starting until
# running: placement and start-up), and each finished job's duration (from its start, or its submit
# when it never ran) by final status. `:jobs_since` limits the scan to jobs with events after it.
OBSERVATIONS = """
WITH status_events AS (
    SELECT e.id, e.job_id, e.status, e.created_at,
           lag(e.status) OVER w AS previous_status, lag(e.created_at) OVER w AS previous_at
    FROM job_events e
    WHERE e.status IS NOT NULL
      AND e.job_id IN (SELECT job_id FROM job_events WHERE id > :jobs_since)
    WINDOW w AS (PARTITION BY e.job_id ORDER BY e.id)
)
SELECT s.id, s.job_id, p.name AS project, s.status::text AS status,
       CASE WHEN s.status = 'starting' AND s.previous_status = 'queued' THEN 'queued'
            WHEN s.status = 'running' AND s.previous_status = 'starting' THEN 'admission'
            ELSE 'duration' END AS figure,
       greatest(0, extract(epoch FROM CASE
            WHEN s.status IN ('starting', 'running') THEN s.created_at - s.previous_at
            ELSE coalesce(j.finished_at, s.created_at) - coalesce(j.started_at, j.created_at) END))::float8 AS seconds
FROM status_events s
JOIN jobs j ON j.id = s.job_id
JOIN projects p ON p.id = j.project_id
WHERE (s.status = 'starting' AND s.previous_status = 'queued')
   OR (s.status = 'running' AND s.previous_status = 'starting')
   OR s.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
"""

ACTIVE = "('starting', 'running', 'cancelling')"
BY_STATUS = "SELECT status::text, count(*) FROM jobs GROUP BY 1"
BY_PROJECT = f"""
    SELECT p.name, count(j.id) FILTER (WHERE j.status = 'queued') AS queued,
           coalesce(sum(j.gang_gpus) FILTER (WHERE j.status IN {ACTIVE}), 0) AS gpus
    FROM projects p
    LEFT JOIN jobs j ON j.project_id = p.id AND (j.status = 'queued' OR j.status IN {ACTIVE})
    GROUP BY p.name
"""
# Ended attempts' resource-seconds per project over all history (the day rollups of migration 0017:
# projects x users x days rows), for counters that only grow.
USAGE_TOTALS = """
    SELECT p.name, sum(u.attempts) AS attempts, sum(u.cpu_starting_s) AS cpu_starting,
           sum(u.cpu_productive_s) AS cpu_productive, sum(u.cpu_lost_s) AS cpu_lost,
           sum(u.gpu_starting_s) AS gpu_starting, sum(u.gpu_productive_s) AS gpu_productive,
           sum(u.gpu_lost_s) AS gpu_lost
    FROM usage_days u JOIN projects p ON p.id = u.project_id GROUP BY p.name
"""
BUCKETED = f"""
    SELECT figure, project, status, bucket, count(*) AS n, sum(seconds) AS total
    FROM (SELECT o.*, (SELECT count(*) FROM unnest(CAST(:bounds AS float8[])) AS b(le) WHERE b.le < o.seconds)
                 AS bucket
          FROM ({OBSERVATIONS}) o) bucketed
    GROUP BY 1, 2, 3, 4
"""


@dataclass(frozen=True)
class Observation:
    id: int
    job_id: uuid.UUID
    project: str
    status: str
    figure: str  # queued · admission · duration
    seconds: float


@dataclass(frozen=True)
class Gauges:
    queue_depth: dict[str, int]  # project → queued jobs
    gpus_held: dict[str, float]  # project → GPUs of admitted gangs (starting, running, cancelling)
    jobs_by_status: dict[str, int]


async def gauges(session: AsyncSession) -> Gauges:
    """Every project appears (0 when idle), so a series drops to zero instead of going stale."""
    rows = (await session.execute(text(BY_PROJECT))).all()
    by_status = (await session.execute(text(BY_STATUS))).all()
    return Gauges(
        queue_depth={row.name: int(row.queued) for row in rows},
        gpus_held={row.name: float(row.gpus) for row in rows},
        jobs_by_status={status: int(count) for status, count in by_status},
    )


async def observations_after(
    session: AsyncSession, after: int, skip: Sequence[int] = (), limit: int = 1000
) -> list[Observation]:
    """Observations from status events with id > `after`, oldest first, leaving out the ids in `skip`."""
    rows = await session.execute(
        text(f"SELECT * FROM ({OBSERVATIONS}) o WHERE o.id > :after AND o.id <> ALL(:skip) ORDER BY o.id LIMIT :limit"),
        {"jobs_since": after, "after": after, "skip": list(skip), "limit": limit},
    )
    return [Observation(**row._mapping) for row in rows]


def _bucketed(
    rows: Sequence[Sequence[Any]], bounds: Sequence[float]
) -> dict[tuple[str, str, str], tuple[list[int], float]]:
    result: dict[tuple[str, str, str], tuple[list[int], float]] = {}
    for figure, project, status, bucket, n, total_s in rows:
        counts, total = result.get((figure, project, status), ([0] * (len(bounds) + 1), 0.0))
        counts[int(bucket)] += int(n)
        result[(figure, project, status)] = (counts, total + float(total_s))
    return result


@dataclass(frozen=True)
class Snapshot:
    gauges: Gauges
    histograms: dict[tuple[str, str, str], tuple[list[int], float]]
    usage: dict[str, dict[str, float]]  # project -> attempts and {cpu,gpu}_{starting,productive,lost} seconds


async def snapshot(session: AsyncSession, bounds: Sequence[float]) -> Snapshot:
    """Every figure /metrics serves, in one statement (one round trip, one consistent read)."""
    row = (
        await session.execute(
            text(
                f"""
                SELECT (SELECT coalesce(json_agg(s), '[]') FROM ({BY_STATUS}) s),
                       (SELECT coalesce(json_agg(p), '[]') FROM ({BY_PROJECT}) p),
                       (SELECT coalesce(json_agg(h), '[]') FROM ({BUCKETED}) h),
                       (SELECT coalesce(json_agg(u), '[]') FROM ({USAGE_TOTALS}) u)
                """
            ),
            {"jobs_since": 0, "bounds": list(bounds)},
        )
    ).one()
    by_status, by_project, bucketed = (_flat(column) for column in row[:3])
    usage = {item.pop("name"): {k: float(v or 0) for k, v in item.items()} for item in row[3]}
    gauges = Gauges(
        queue_depth={name: int(queued) for name, queued, _ in by_project},
        gpus_held={name: float(gpus) for name, _, gpus in by_project},
        jobs_by_status={status: int(count) for status, count in by_status},
    )
    return Snapshot(gauges, _bucketed(bucketed, bounds), usage)


def _flat(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """json_agg's rows (objects, their keys in column order: json keeps it) as lists of values."""
    return [list(row.values()) for row in rows]


async def max_event_id(session: AsyncSession) -> int:
    return int((await session.execute(text("SELECT coalesce(max(id), 0) FROM job_events"))).scalar_one())


async def max_metric_seq(session: AsyncSession) -> int:
    return int((await session.execute(text("SELECT coalesce(max(seq), 0) FROM metric_points"))).scalar_one())


@dataclass(frozen=True)
class ExportedPoint:
    """A metric point as the exporters read it (with its job and attempt), not the ingest's `Point`."""

    seq: int
    job_id: uuid.UUID
    attempt: int | None
    rank: int
    step: int | None
    name: str
    value: float
    ts: datetime


async def points_after(
    session: AsyncSession, after: int, skip: Sequence[int], labels: dict[str, str] | None, limit: int = 5000
) -> list[ExportedPoint]:
    """Metric points with seq > `after` (not in `skip`), of jobs whose labels contain `labels` (all
    jobs when None), oldest first."""
    label_filter = "AND j.labels @> CAST(:labels AS jsonb)" if labels is not None else ""

    rows = await session.execute(
        text(
            f"""
            SELECT m.seq, m.job_id, m.attempt, m.rank, m.step, m.name, m.value, m.ts
            FROM metric_points m JOIN jobs j ON j.id = m.job_id
            WHERE m.seq > :after AND m.seq <> ALL(:skip) {label_filter}
            ORDER BY m.seq LIMIT :limit
            """
        ),
        {"after": after, "skip": list(skip), "labels": json.dumps(labels or {}), "limit": limit},
    )
    return [ExportedPoint(**row._mapping) for row in rows]


@dataclass(frozen=True)
class AttemptTimes:
    n: int
    ray_submission_id: str
    status: str
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    first_step_at: datetime | None


@dataclass(frozen=True)
class JobTimeline:
    id: uuid.UUID
    name: str
    project: str
    status: str
    error: str | None
    spec: dict[str, Any]
    labels: dict[str, str]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    admitted_at: datetime | None
    attempts: list[AttemptTimes]


async def timelines(session: AsyncSession, job_ids: Sequence[uuid.UUID]) -> list[JobTimeline]:
    """What a job's trace needs: submit, first admission, each attempt's launch, first step and end."""
    if not job_ids:
        return []
    jobs = await session.execute(
        text(
            """
            SELECT j.id, j.name, p.name AS project, j.status::text AS status, j.error, j.spec, j.labels,
                   j.created_at, j.started_at, j.finished_at,
                   (SELECT min(e.created_at) FROM job_events e WHERE e.job_id = j.id AND e.status = 'starting')
                     AS admitted_at
            FROM jobs j JOIN projects p ON p.id = j.project_id WHERE j.id = ANY(:ids)
            """
        ),
        {"ids": list(job_ids)},
    )
    attempts = await session.execute(
        text(
            """
            SELECT a.job_id, a.n, a.ray_submission_id, a.status::text AS status, a.error,
                   a.created_at, a.started_at, a.finished_at,
                   (SELECT min(m.ts) FROM metric_points m WHERE m.job_id = a.job_id AND m.attempt = a.n)
                     AS first_step_at
            FROM job_attempts a WHERE a.job_id = ANY(:ids) ORDER BY a.job_id, a.n
            """
        ),
        {"ids": list(job_ids)},
    )
    by_job: dict[uuid.UUID, list[AttemptTimes]] = {}
    for row in attempts:
        values = dict(row._mapping)
        by_job.setdefault(values.pop("job_id"), []).append(AttemptTimes(**values))
    return [JobTimeline(**row._mapping, attempts=by_job.get(row.id, [])) for row in jobs]
