"""A metric batch from the request body straight to the five binary arrays STORE_BATCH inserts.

The rules are MetricBatchIn's (`trainmaster.models`); tests/unit/test_metric_batch.py holds every path
here to the same answers. Two decoders share them:

- msgspec decodes the body into structs the garbage collector does not track (`gc=False`): pydantic
  builds 4,000 dicts and datetimes for a batch of 1,000 points, slower to build, and the API's
  collector then walks every one of them, a large share of the API's CPU under ingest load (the
  profiles and figures are in bench/README.md).
- pydantic, the reference, whenever msgspec refuses a body or meets a value it does not map the way
  pydantic does (a Unix time outside 1970 to 2603, which pydantic reads as milliseconds or refuses):
  it accepts what pydantic's lax mode accepts (a step of 5.0, a time of "2026-12-01T10:00Z") and its
  errors are the 422 FastAPI answers for a MetricBatchIn body.

One difference is kept on purpose: a time with more than six fractional digits is rounded to the
microsecond, as PostgreSQL itself rounds one, where pydantic truncates.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any

import msgspec
from fastapi.exceptions import RequestValidationError
from pydantic import ConfigDict, Field, TypeAdapter
from pydantic import ValidationError as PydanticValidationError
from typing_extensions import NotRequired, TypedDict

from api.db.arrays import (
    Float8Array,
    Int4Array,
    Int8Array,
    TextArray,
    TimestamptzArray,
    float8_array,
    int4_array,
    int8_array,
    text_array,
    timestamptz_array,
)
from api.errors import ValidationError
from trainmaster.models import MAX_ATTEMPT, MAX_POINTS_PER_BATCH, MAX_RANK, MAX_STEP

# ------------------------------------------------------------------ the reference: pydantic, plain dicts


class _PointDict(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    step: NotRequired[Annotated[int, Field(ge=0, le=MAX_STEP)] | None]
    values: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[float, Field(allow_inf_nan=True)]]
    rank: NotRequired[Annotated[int, Field(ge=0, le=MAX_RANK)]]
    ts: NotRequired[datetime | None]


class _BatchDict(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    batch_id: NotRequired[uuid.UUID | None]
    attempt: NotRequired[Annotated[int, Field(ge=1, le=MAX_ATTEMPT)] | None]
    points: Annotated[list[_PointDict], Field(max_length=MAX_POINTS_PER_BATCH)]


_REFERENCE = TypeAdapter(_BatchDict)

# ------------------------------------------------------------------ the fast decoder: msgspec structs

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class Point(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    values: dict[_Name, float]
    step: Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)] | None = None
    rank: Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)] = 0
    ts: datetime | float | None = None  # a JSON number is Unix seconds


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    points: Annotated[list[Point], msgspec.Meta(max_length=MAX_POINTS_PER_BATCH)]
    batch_id: uuid.UUID | None = None
    attempt: Annotated[int, msgspec.Meta(ge=1, le=MAX_ATTEMPT)] | None = None


_FAST = msgspec.json.Decoder(_Batch)

# ------------------------------------------------------------------ rows

_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)  # PostgreSQL's: timestamptz is microseconds since
_EPOCH_NAIVE = _EPOCH.replace(tzinfo=None)
_EPOCH_UNIX_US = 946_684_800_000_000
_MICROSECOND = timedelta(microseconds=1)
_UNIX_SECONDS_BELOW = 2e10  # pydantic reads a larger number as milliseconds


class _Unmapped(Exception):
    """A value the fast path does not convert as pydantic would: the body goes the reference way."""


@dataclass
class Rows:
    """A batch's rows as the arrays STORE_BATCH inserts (one row per point and name)."""

    ranks: Int4Array
    steps: Int8Array
    names: TextArray
    values: Float8Array
    stamps: TimestamptzArray


@dataclass
class Batch:
    batch_id: uuid.UUID | None
    attempt: int | None
    points: int
    rows: Rows
    latest: dict[str, Any]  # rank 0's newest values, and its step
    values: int  # rows: one per point and name, what the write limits count
    names: set[str]  # the distinct names (the limit on a job's names)


def _micros(ts: datetime | float | None, now: int) -> int:
    """Microseconds since 2000-01-01 UTC of a time `_rows` does not convert itself: no time is `now`
    (when the batch arrived), no offset is UTC; a number outside 1970-2603 is pydantic's to read."""
    if ts is None:
        return now
    if not isinstance(ts, datetime):
        raise _Unmapped
    return (ts - (_EPOCH if ts.tzinfo is not None else _EPOCH_NAIVE)) // _MICROSECOND


def _rows(points: list[Point], now: int) -> tuple[Rows, dict[str, Any], list[str]]:
    """The arrays, and `latest`: rank 0's newest value of each name, with the step of its newest point
    that is not only ray.train.report's values (their step is an epoch)."""
    ranks: list[int] = []
    steps: list[int | None] = []
    names: list[str] = []
    values: list[float] = []
    stamps: list[int] = []
    latest: dict[str, Any] = {}
    stepped: list[Point] = []  # rank 0's points with a step, oldest first
    for point in points:
        rank, step, named, ts = point.rank, point.step, point.values, point.ts
        if ts.__class__ is float and 0.0 <= ts < _UNIX_SECONDS_BELOW:  # the usual time: Unix seconds
            # rounded to the microsecond, half up, as pydantic rounds them
            whole = int(ts)
            fraction = (ts - whole) * 1e6
            part = int(fraction)
            stamp = whole * 1_000_000 + part + (fraction - part >= 0.5) - _EPOCH_UNIX_US
        else:
            stamp = _micros(ts, now)
        names.extend(named)
        values.extend(named.values())
        if len(named) == 1:  # the usual point: one value
            ranks.append(rank)
            steps.append(step)
            stamps.append(stamp)
        else:
            count = len(named)
            ranks.extend([rank] * count)
            steps.extend([step] * count)
            stamps.extend([stamp] * count)
        if rank == 0:
            latest.update(named)
            if step is not None:
                stepped.append(point)
    for point in reversed(stepped):
        if any(not name.startswith("report/") for name in point.values):
            latest["step"] = point.step
            break
    arrays = int4_array(ranks), int8_array(steps), text_array(names), float8_array(values), timestamptz_array(stamps)
    return Rows(*arrays), latest, names


def _now() -> int:
    return (datetime.now(timezone.utc) - _EPOCH) // _MICROSECOND


def _reference(body: bytes) -> tuple[uuid.UUID | None, int | None, list[Point]]:
    """The body as pydantic reads it, or the 422 FastAPI answers for a MetricBatchIn body."""
    try:
        batch = _REFERENCE.validate_json(body)
    except PydanticValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
    points = [Point(p["values"], p.get("step"), p.get("rank", 0), p.get("ts")) for p in batch["points"]]
    return batch.get("batch_id"), batch.get("attempt"), points


def _refuse_nul(points: list[Point]) -> None:
    """A 422 naming every point with a NUL in a name (a sender drops exactly those and sends the rest)."""
    message = "a metric name contains a NUL character (\\u0000)"
    errors = [
        {"loc": ["body", "points", index, "values"], "msg": message, "type": "value_error"}
        for index, point in enumerate(points)
        if any("\x00" in name for name in point.values)
    ]
    if errors:
        raise ValidationError(errors)


def parse_batch(body: bytes) -> Batch:
    """A metric batch, validated, as rows; a 422 (RequestValidationError or ValidationError) otherwise,
    naming every bad point as `loc: ["body", "points", <index>, <field>, …]` (nothing of it is stored).

    The usual batch costs one msgspec decode; only a batch that fails it is read again, by pydantic,
    whose errors name every bad point."""
    now = _now()
    try:
        fast = _FAST.decode(body)
        batch_id, attempt, points = fast.batch_id, fast.attempt, fast.points
        rows, latest, names = _rows(points, now)
    except (msgspec.ValidationError, msgspec.DecodeError, _Unmapped):
        batch_id, attempt, points = _reference(body)
        rows, latest, names = _rows(points, now)  # pydantic's datetimes: nothing left unmapped
    if b"\\u0000" in body:  # a NUL can only come escaped (JSON forbids a raw one in a string)
        _refuse_nul(points)
    return Batch(batch_id, attempt, len(points), rows, latest, len(names), set(names))
