"""Metrics: batched ingest (COPY + one NOTIFY), reads for charts, live streams."""

from __future__ import annotations

import math
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import Principal
from api.errors import ValidationError
from api.jobs import service as jobs
from api.metrics import repository
from api.streaming.broker import METRICS_CHANNEL
from trainmaster.models import MetricBatchAck, MetricBatchIn, MetricValue

STREAM_BATCH = 2000


async def ingest(session: AsyncSession, principal: Principal, raw_id: str, batch: MetricBatchIn) -> MetricBatchAck:
    job_id = await jobs.writable_job_id(session, principal, raw_id)
    payload, stored = repository.encode_points(job_id, batch.attempt, batch.points)
    await repository.lock_job_stream(session, job_id)
    if batch.batch_id is not None and not await repository.claim_batch(
        session, job_id, batch.batch_id, len(batch.points)
    ):
        return MetricBatchAck(stored=0, duplicate=True)
    await repository.copy_encoded(session, payload)
    latest: dict[str, Any] = {}
    for point in batch.points:
        if point.rank == 0:
            latest.update(point.values)
            if point.step is not None and not all(name.startswith("report/") for name in point.values):
                latest["step"] = point.step  # the training step, not the epoch of a ray.train.report
    if latest:
        await repository.merge_latest(session, job_id, latest)
    await session.execute(text("SELECT pg_notify(:channel, :job)"), {"channel": METRICS_CHANNEL, "job": str(job_id)})
    return MetricBatchAck(stored=stored)


def to_value(row: Any) -> MetricValue:
    value = row.value if row.value is not None and math.isfinite(row.value) else None
    return MetricValue(seq=row.seq, step=row.step, rank=row.rank, name=row.name, value=value, ts=row.ts)


async def read(
    session: AsyncSession,
    principal: Principal,
    raw_id: str,
    *,
    names: list[str],
    since_step: int | None,
    max_points: int | None,
    after_seq: int,
    limit: int,
    until_step: int | None = None,
    rank: int | None = None,
) -> list[MetricValue]:
    job = await jobs.get_owned(session, principal, raw_id)
    if since_step is not None and until_step is not None and until_step < since_step:
        raise ValidationError.field(["query", "until_step"], f"must be at least since_step ({since_step})")
    window = repository.Window(since_step=since_step, until_step=until_step, rank=rank)
    if max_points is not None:
        rows = await repository.read_downsampled(session, job.id, max_points, names, window)
    else:
        rows = await repository.read_after(session, job.id, after_seq, limit, names, window)
    return [to_value(row) for row in rows]


async def read_for_stream(session: AsyncSession, job_id: uuid.UUID, after_seq: int) -> tuple[list[dict[str, Any]], int]:
    rows = await repository.read_after(session, job_id, after_seq, STREAM_BATCH)
    return [to_value(row).model_dump(mode="json") for row in rows], (rows[-1].seq if rows else after_seq)
