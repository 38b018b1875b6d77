"""Metrics: batched ingest (binary COPY + one NOTIFY), reads for charts, live streams."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import ConfigDict, Field, TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from typing_extensions import NotRequired, TypedDict

from api.auth.service import Principal
from api.db.direct import Direct
from api.errors import JobNotFound, ValidationError
from api.jobs import service as jobs
from api.metrics import repository
from api.streaming.broker import METRICS_CHANNEL
from trainmaster.models import MAX_POINTS_PER_BATCH, MetricBatchAck

STREAM_BATCH = 2000


class _Point(TypedDict):
    """MetricPoint's rules (trainmaster/models.py), validated into a plain dict: no object per point."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    step: NotRequired[Annotated[int, Field(ge=0)] | None]
    values: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[float, Field(allow_inf_nan=True)]]
    rank: NotRequired[Annotated[int, Field(ge=0)]]
    ts: NotRequired[datetime | None]


class _Batch(TypedDict):
    """MetricBatchIn's rules, likewise (tests/unit/test_metric_batch.py holds the two to the same answers)."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    batch_id: NotRequired[uuid.UUID | None]
    attempt: NotRequired[Annotated[int, Field(ge=1)] | None]
    points: Annotated[list[_Point], Field(max_length=MAX_POINTS_PER_BATCH)]


_BATCH = TypeAdapter(_Batch)


def parse_batch(body: bytes) -> _Batch:
    """A metric batch from the request body, parsed and validated in one pass (pydantic-core), or the
    same 422 FastAPI answers for a MetricBatchIn body."""
    try:
        batch = _BATCH.validate_json(body)
    except PydanticValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
    for index, point in enumerate(batch["points"]):
        for name in point["values"]:
            if "\x00" in name:
                raise ValidationError.field(
                    ["body", "points", index, "values"], "a metric name contains a NUL character (\\u0000)"
                )
    return batch


async def ingest(direct: Direct, principal: Principal, raw_id: str, body: bytes) -> MetricBatchAck:
    if principal.job_id is not None and str(principal.job_id) != raw_id:
        raise JobNotFound(f"no job {raw_id!r} for this job token")
    job_id = jobs.parse_job_id(raw_id)
    batch = parse_batch(body)
    points = batch["points"]
    latest: dict[str, Any] = {}
    for point in points:
        if point.get("rank", 0) == 0:
            values = point["values"]
            latest.update(values)
            step = point.get("step")
            if step is not None and not all(name.startswith("report/") for name in values):
                latest["step"] = step  # the training step, not the epoch of a ray.train.report
    state, stored = await repository.store_batch(
        direct,
        job_id,
        principal.project_id,
        batch.get("batch_id"),
        len(points),
        batch.get("attempt"),
        repository.columns(points),
        latest,
        METRICS_CHANNEL,
    )
    if state == "missing":
        raise JobNotFound(f"no job {raw_id!r} in project {principal.project_name!r}")
    return MetricBatchAck(stored=stored, duplicate=state == "duplicate")


class Value(TypedDict):
    """MetricValue's fields (trainmaster/models.py) as a plain dict: a chart's read of 20,000 points
    builds no model per point (that took about 15 µs a point) and is encoded once (`encode_list`)."""

    seq: int
    step: int | None
    rank: int
    name: str
    value: float | None  # null for NaN and infinities, which JSON cannot carry
    ts: datetime


_VALUES = TypeAdapter(list[Value])


def to_value(row: Any) -> Value:
    """A row of (seq, step, rank, name, value, ts), the repository's reads' columns, read by position
    (a SQLAlchemy Row's attributes cost about 1 µs each)."""
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
