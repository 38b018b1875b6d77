"""Metric points: one INSERT per batch in, ordered reads out, downsampled reads for charts."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct
from api.metrics.batch import Batch

# A batch stored in one statement, its own transaction on a direct connection (api/db/direct.py): the
# job checked (the caller's project) and its writers serialized, so sequence numbers commit in order
# (readers resume by seq); the batch id claimed (a retry whose first answer was lost stores nothing
# twice); the points inserted from five binary arrays (built in api/metrics/batch.py); rank 0's latest
# values merged into the job; the streams told (NOTIFY, sent at commit). The lock is held from inside
# the statement to its commit, so no other request's work in the API process stretches it: with COPY
# between two statements the lock waited on the event loop, which was busy parsing other batches.
STORE_BATCH = """
    WITH job AS (
        SELECT id, pg_advisory_xact_lock(hashtextextended('m:' || id::text, 0)) AS locked
        FROM jobs WHERE id = %(job)s AND project_id = %(project)s
    ),
    claimed AS (
        INSERT INTO metric_batches (job_id, batch_id, points)
        SELECT id, %(batch)s::uuid, %(points)s FROM job WHERE %(batch)s::uuid IS NOT NULL
        ON CONFLICT DO NOTHING RETURNING job_id
    ),
    accepted AS (
        SELECT id FROM job WHERE %(batch)s::uuid IS NULL OR EXISTS (SELECT FROM claimed)
    ),
    stored AS (
        INSERT INTO metric_points (job_id, attempt, rank, step, name, value, ts)
        SELECT accepted.id, %(attempt)s::int4, p.rank, p.step, p.name, p.value, p.ts
        FROM accepted CROSS JOIN unnest(
            %(ranks)b::int4[], %(steps)b::int8[], %(names)b::text[], %(values)b::float8[], %(stamps)b::timestamptz[]
        ) AS p(rank, step, name, value, ts)
        RETURNING 1
    ),
    merged AS (
        UPDATE jobs SET latest_metrics = coalesce(latest_metrics, '{}'::jsonb) || %(latest)s::jsonb
        WHERE id = (SELECT id FROM accepted) AND %(merge)s
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM job) AS found, (SELECT count(*) FROM stored) AS stored,
           (SELECT count(*) FROM accepted) AS accepted,
           (SELECT pg_notify(%(channel)s, id::text) FROM accepted) AS notified
"""


async def store_batch(
    direct: Direct, job_id: uuid.UUID, project_id: uuid.UUID, batch: Batch, channel: str
) -> tuple[str, int]:
    """("missing", 0): no such job in the project; ("duplicate", 0): this batch id was stored before;
    ("stored", rows)."""
    rows = batch.rows
    params = {
        "job": job_id,
        "project": project_id,
        "batch": batch.batch_id,
        "points": batch.points,
        "attempt": batch.attempt,
        "ranks": rows.ranks,
        "steps": rows.steps,
        "names": rows.names,
        "values": rows.values,
        "stamps": rows.stamps,
        "latest": _json(batch.latest),
        "merge": bool(batch.latest),
        "channel": channel,
    }
    found, stored, accepted, _notified = await direct.one(STORE_BATCH, params) or (0, 0, 0, None)
    if not found:
        return "missing", 0
    return ("stored", int(stored)) if accepted else ("duplicate", 0)


@dataclass(frozen=True)
class Window:
    """Which points a chart asks for: a step range (inclusive) and one rank, each optional."""

    since_step: int | None = None
    until_step: int | None = None
    rank: int | None = None

    def clauses(self, params: dict[str, Any]) -> list[str]:
        clauses = []
        for column, op, key in (("step", ">=", "since_step"), ("step", "<=", "until_step"), ("rank", "=", "rank")):
            value = getattr(self, key)
            if value is not None:
                clauses.append(f"{column} {op} :{key}")
                params[key] = value
        return clauses


async def read_after(
    session: AsyncSession,
    job_id: uuid.UUID,
    after_seq: int,
    limit: int,
    names: Sequence[str] = (),
    window: Window = Window(),
) -> list[Any]:
    clauses = ["job_id = :job", "seq > :after"]
    params: dict[str, Any] = {"job": job_id, "after": after_seq, "limit": limit}
    if names:
        clauses.append("name = ANY(:names)")
        params["names"] = list(names)
    clauses += window.clauses(params)
    query = (
        "SELECT seq, step, rank, name, value, ts FROM metric_points WHERE "
        + " AND ".join(clauses)
        + " ORDER BY seq LIMIT :limit"
    )
    return list((await session.execute(text(query), params)).all())


BLOCK_SHIFT = 12  # a point's block in metric_blocks is seq >> 12 (migration 0005's trigger)
RAW_DOWNSAMPLE_LIMIT = 50_000  # up to this many points, downsample the points themselves (exact buckets)


async def read_downsampled(
    session: AsyncSession,
    job_id: uuid.UUID,
    max_points: int,
    names: Sequence[str] = (),
    window: Window = Window(),
) -> list[Any]:
    """At most about `max_points` per name: each of max_points/2 buckets keeps its min and max.

    Up to RAW_DOWNSAMPLE_LIMIT points the buckets split the points themselves; past it they split
    the job's metric_blocks (each block's min and max point, kept at ingest), so the cost follows
    the number of blocks, not points. A block only partly inside the step window is read point by
    point."""
    clauses = ["job_id = :job"]
    params: dict[str, Any] = {"job": job_id, "buckets": max(1, max_points // 2)}
    if names:
        clauses.append("name = ANY(:names)")
        params["names"] = list(names)
    if window.rank is not None:
        clauses.append("rank = :rank")
        params["rank"] = window.rank
    # Whether the job has more than RAW_DOWNSAMPLE_LIMIT points: a running sum over its blocks that
    # stops at the first block past the limit (a few hundred rows of a big job, not all of them).
    past_limit = f"""
        SELECT 1 FROM (SELECT sum(n) OVER (ORDER BY name, rank, block) AS running
                       FROM metric_blocks WHERE {" AND ".join(clauses)}) blocks
        WHERE running > {RAW_DOWNSAMPLE_LIMIT} LIMIT 1"""
    if (await session.execute(text(past_limit), params)).first() is None:
        return await _downsample_points(session, job_id, params["buckets"], names, window)
    return await _downsample_blocks(session, clauses, params, window)


async def _downsample_points(
    session: AsyncSession, job_id: uuid.UUID, buckets: int, names: Sequence[str], window: Window
) -> list[Any]:
    clauses = ["job_id = :job"]
    params: dict[str, Any] = {"job": job_id, "buckets": buckets}
    if names:
        clauses.append("name = ANY(:names)")
        params["names"] = list(names)
    clauses += window.clauses(params)
    where = " AND ".join(clauses)
    query = f"""
        WITH ranked AS (
            SELECT seq, step, rank, name, value, ts,
                   ntile(:buckets) OVER (PARTITION BY name ORDER BY seq) AS bucket
            FROM metric_points WHERE {where}
        ),
        extremes AS (
            (SELECT DISTINCT ON (name, bucket) * FROM ranked ORDER BY name, bucket, value ASC NULLS LAST, seq)
            UNION
            (SELECT DISTINCT ON (name, bucket) * FROM ranked ORDER BY name, bucket, value DESC NULLS LAST, seq)
        )
        SELECT seq, step, rank, name, value, ts FROM extremes ORDER BY seq
    """
    return list((await session.execute(text(query), params)).all())


async def _downsample_blocks(
    session: AsyncSession, clauses: list[str], params: dict[str, Any], window: Window
) -> list[Any]:
    """Buckets over the blocks, one name at a time (a LATERAL per name): each name's few thousand
    block rows are bucketed and sorted by number in memory, instead of every name's rows sorted
    together by their text name (which spilled to disk at 10,000,000 points)."""
    where = " AND ".join(f"b.{clause}" for clause in clauses)
    bounds = []
    for column, op, key in (("max_step", ">=", "since_step"), ("min_step", "<=", "until_step")):
        if getattr(window, key) is not None:
            bounds.append(f"b.{column} {op} :{key}")
            params[key] = getattr(window, key)
    inside = ["b.stepped = b.n"] if bounds else []
    inside += [
        f"b.{c} {op} :{k}"
        for c, op, k in (("min_step", ">=", "since_step"), ("max_step", "<=", "until_step"))
        if getattr(window, k) is not None
    ]
    whole = " AND ".join(inside) or "true"
    touching = " AND ".join([where, "b.name = n.name", *bounds])
    point_filter = " AND ".join(f"p.{clause}" for clause in window.clauses({}) if not clause.startswith("rank"))
    if "names" in params:
        names = "SELECT DISTINCT unnest(CAST(:names AS text[])) AS name"
    else:  # the job's names by a skip scan of the primary key: one probe per name
        names = """
            WITH RECURSIVE found AS (
                (SELECT name FROM metric_blocks WHERE job_id = :job ORDER BY name LIMIT 1)
                UNION ALL
                SELECT (SELECT b.name FROM metric_blocks b WHERE b.job_id = :job AND b.name > found.name
                        ORDER BY b.name LIMIT 1)
                FROM found WHERE found.name IS NOT NULL
            )
            SELECT name FROM found WHERE name IS NOT NULL"""
    query = f"""
        SELECT e.seq, e.step, e.rank, n.name, e.value, e.ts
        FROM ({names}) n CROSS JOIN LATERAL (
            WITH parts AS (
                SELECT b.block << {BLOCK_SHIFT} AS pos, b.rank, b.lo_value, b.lo_seq, b.lo_step, b.lo_ts,
                       b.hi_value, b.hi_seq, b.hi_step, b.hi_ts
                FROM metric_blocks b WHERE {touching} AND {whole}
                UNION ALL
                SELECT p.seq, p.rank, p.value, p.seq, p.step, p.ts, p.value, p.seq, p.step, p.ts
                FROM metric_blocks b JOIN metric_points p
                  ON p.job_id = b.job_id AND p.name = b.name AND p.rank = b.rank
                 AND p.seq >= b.block << {BLOCK_SHIFT} AND p.seq < (b.block + 1) << {BLOCK_SHIFT}
                WHERE {touching} AND NOT ({whole}){f" AND {point_filter}" if point_filter else ""}
            ),
            bucketed AS (
                SELECT parts.*, (pos - min(pos) OVER ()) * :buckets / (max(pos) OVER () - min(pos) OVER () + 1)
                       AS bucket
                FROM parts
            )
            (SELECT DISTINCT ON (bucket) lo_seq AS seq, lo_step AS step, rank, lo_value AS value, lo_ts AS ts
             FROM bucketed ORDER BY bucket, lo_value ASC, lo_seq)
            UNION
            (SELECT DISTINCT ON (bucket) hi_seq, hi_step, rank, hi_value, hi_ts
             FROM bucketed ORDER BY bucket, hi_value DESC, hi_seq)
        ) e
        ORDER BY e.seq
    """
    # The planner's estimate for a job of millions of points passes jit_above_cost, and compiling the
    # query (about 35 ms) is more than JIT saves on the few thousand block rows per name it reads.
    await session.execute(text("SET LOCAL jit = off"))
    return list((await session.execute(text(query), params)).all())


def _json(value: Any) -> str:
    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return json.dumps({k: clean(v) for k, v in value.items()})
