"""Metrics: batched ingest (one statement of binary arrays + one NOTIFY), reads for charts, live streams."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncSession
from typing_extensions import TypedDict

from api.auth.principal import Principal
from api.db.direct import Direct
from api.errors import JobNotFound, ValidationError
from api.jobs import service as jobs
from api.limits.service import WriteLimits
from api.metrics import repository
from api.metrics.batch import parse_batch
from api.streaming.broker import METRICS_CHANNEL
from trainmaster.models import MetricBatchAck

STREAM_BATCH = 2000


async def ingest(direct: Direct, limits: WriteLimits, principal: Principal, raw_id: str, body: bytes) -> MetricBatchAck:
    """Store a batch within its job's and its project's write limits (api/limits/), or refuse it whole."""
    if principal.job_id is not None and str(principal.job_id) != raw_id:
        raise JobNotFound(f"no job {raw_id!r} for this job token")
    job_id = jobs.parse_job_id(raw_id)
    batch = parse_batch(body)
    project_id = principal.project_id
    limits.take_points(project_id, job_id, batch.values)
    try:
        await limits.check_metric_names(direct, job_id, project_id, batch.names)
        state, stored = await repository.store_batch(direct, job_id, project_id, batch, METRICS_CHANNEL)
    except BaseException:
        limits.give_points(project_id, job_id, batch.values)
        raise
    if state != "stored":
        limits.give_points(project_id, job_id, batch.values)
    if state == "missing":
        raise JobNotFound(f"no job {raw_id!r} in project {principal.project_name!r}")
    limits.names_stored(job_id, batch.names)
    return MetricBatchAck(stored=stored, duplicate=state == "duplicate")


class Value(TypedDict):
    """MetricValue's fields (`trainmaster.models`) as a plain dict: a chart's read of 20,000 points
    builds no model per point (validating one per point would be most of the read's work) and is
    encoded once (`encode_list`)."""

    seq: int
    step: int | None
    rank: int
    name: str
    value: float | None  # null for NaN and infinities, which JSON cannot carry
    ts: datetime


_VALUES = TypeAdapter(list[Value])


def to_value(row: Any) -> Value:
    """A row of (seq, step, rank, name, value, ts), the repository's reads' columns, read by position
    (a SQLAlchemy Row's attribute lookup costs far more than unpacking it, on every field of every point)."""
    seq, step, rank, name, value, ts = row
    if value is not None and not math.isfinite(value):
        value = None
    return {"seq": seq, "step": step, "rank": rank, "name": name, "value": value, "ts": ts}


def encode_list(values: list[Value]) -> bytes:
    """A MetricList's JSON, `{"items": [...]}`, written by pydantic-core as MetricList's would be."""
    return b'{"items":' + _VALUES.dump_json(values) + b"}"


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
) -> list[Value]:
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
    points: list[dict[str, Any]] = _VALUES.dump_python([to_value(row) for row in rows], mode="json")
    return points, (rows[-1].seq if rows else after_seq)
