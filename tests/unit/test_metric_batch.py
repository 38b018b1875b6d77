"""The ingest path decodes metric batches with msgspec, falling back to pydantic (api/metrics/batch.py),
instead of MetricBatchIn models: all must accept and refuse the same bodies, and the binary arrays must
carry what the points said."""

from __future__ import annotations

import json
import random
import struct
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError as PydanticValidationError

from api.errors import ValidationError
from api.metrics import batch as batch_module
from api.metrics.batch import Batch, parse_batch
from trainmaster.models import MetricBatchIn

GOOD: list[Any] = [
    {"points": []},
    {"points": [{"values": {"loss": 1}}]},
    {"points": [{"step": 0, "values": {"loss": 1.5, "acc": 2}, "rank": 3, "ts": "2026-12-01T10:00:00+00:00"}]},
    {"batch_id": str(uuid.uuid4()), "attempt": 2, "points": [{"step": None, "values": {}, "ts": None}]},
    {"batch_id": None, "attempt": None, "points": [{"step": 5, "values": {"x" * 256: -1e300}}]},
    {"points": [{"values": {"loss": 1}, "ts": 1764612345.25}]},  # Unix seconds, as trainmaster.log sends
    {"points": [{"values": {"loss": 1}, "ts": 1764612345}]},
    {"points": [{"values": {"loss": 1}, "ts": 1764612345123.5}]},  # milliseconds, as pydantic reads them
    {"points": [{"values": {"loss": 1}, "ts": -1.5}]},
    {"points": [{"step": 5.0, "values": {"loss": 1}}]},  # pydantic's lax mode: the reference path
    {"points": [{"step": "7", "values": {"loss": "0.5"}, "rank": "1"}]},
    {"points": [{"values": {"loss": 1}, "ts": "2026-12-01T10:00Z"}]},
    {"points": [{"values": {"loss": 1}, "ts": "2026-12-01T10:00:00,5Z"}]},
    {"points": [{"values": {"loss": 1}, "ts": "2026-12-01T10:00:00+05:30"}]},
    {"points": [{"values": {"loss": 1}, "ts": "2026-12-01T10:00:00"}]},  # no offset: UTC
    {"points": [{"step": 2**63 - 1, "values": {"loss": 1}, "rank": 2**31 - 1}], "attempt": 2**31 - 1},
    {"batch_id": uuid.uuid4().hex, "points": []},
    {"batch_id": str(uuid.uuid4()).upper(), "points": []},
    {"points": [{"values": {"loss": True}}]},  # pydantic reads true as 1.0
    {"points": [{"values": {"a": 1, "b": 2, "c": 3}, "step": 1}, {"values": {"report/epoch": 1}, "step": 9}]},
]
BAD: list[Any] = [
    {},
    {"points": [{"values": {"loss": 1}}], "extra": 1},
    {"points": [{"values": {"loss": 1}, "typo": 1}]},
    {"points": [{"step": -1, "values": {"loss": 1}}]},
    {"points": [{"values": {"": 1}}]},
    {"points": [{"values": {"x" * 257: 1}}]},
    {"points": [{"values": {"loss": "high"}}]},
    {"points": [{"values": {"loss": 1}, "rank": -1}]},
    {"points": [{"values": {"loss": 1}, "ts": "yesterday"}]},
    {"attempt": 0, "points": []},
    {"batch_id": "not-a-uuid", "points": []},
    {"points": [{"values": {"loss": 1}}] * 20_001},
    {"points": [{"step": 1.5, "values": {"loss": 1}}]},
    {"points": "many"},
    {"points": [{"step": 2**63, "values": {"loss": 1}}]},  # past bigint: a 422, not a failed insert
    {"points": [{"values": {"loss": 1}, "rank": 2**31}]},
    {"attempt": 2**31, "points": []},
    {"points": [{"values": {"loss": 1}, "ts": 1e15}]},  # after 9999
    {"points": [{"values": {"loss": 1}, "ts": "2026-12-01T24:00:00Z"}]},
    {"points": [None]},
]

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def decoded(array: bytes) -> list[Any]:
    """A one-dimensional binary PostgreSQL array (as api/db/arrays.py builds it) back to Python values."""
    ndim, has_nulls, oid, count, lower = struct.unpack_from(">iiIii", array)
    assert (ndim, lower) == (1, 1)
    offset, out = 20, []
    for _ in range(count):
        (length,) = struct.unpack_from(">i", array, offset)
        offset += 4
        if length == -1:
            out.append(None)
            continue
        raw = array[offset : offset + length]
        offset += length
        if oid == 25:
            out.append(raw.decode())
        elif oid == 701:
            out.append(struct.unpack(">d", raw)[0])
        elif oid == 1184:
            out.append(EPOCH + timedelta(microseconds=struct.unpack(">q", raw)[0]))
        else:
            out.append(int.from_bytes(raw, "big", signed=True))
    assert offset == len(array) and has_nulls == (None in out)
    return out


def expected_rows(model: MetricBatchIn) -> list[tuple[Any, ...]]:
    """(rank, step, name, value, ts) per point and name, from the reference model; ts None: no time."""
    rows = []
    for point in model.points:
        ts = point.ts
        if ts is not None and ts.tzinfo is None:
            ts = ts.replace(tzinfo=timezone.utc)
        rows += [(point.rank, point.step, name, value, ts) for name, value in point.values.items()]
    return rows


def rows_of(batch: Batch) -> list[tuple[Any, ...]]:
    r = batch.rows
    columns = [decoded(r.ranks), decoded(r.steps), decoded(r.names), decoded(r.values), decoded(r.stamps)]
    return list(zip(*columns, strict=True))  # strict: every column has a value for every row


@pytest.mark.parametrize("body", GOOD, ids=range(len(GOOD)))
def test_both_accept_and_store_the_same_rows(body: Any) -> None:
    raw = json.dumps(body).encode()
    model = MetricBatchIn.model_validate_json(raw)
    before = datetime.now(timezone.utc).replace(microsecond=0)
    parsed = parse_batch(raw)
    assert (parsed.batch_id, parsed.attempt, parsed.points) == (model.batch_id, model.attempt, len(model.points))
    mine, theirs = rows_of(parsed), expected_rows(model)
    assert [row[:4] for row in mine] == [row[:4] for row in theirs]
    for (*_, stamp), (*_, ts) in zip(mine, theirs, strict=True):
        assert stamp == ts if ts is not None else stamp >= before  # no time: the time it arrived


@pytest.mark.parametrize("body", BAD, ids=range(len(BAD)))
def test_both_refuse(body: Any) -> None:
    raw = json.dumps(body).encode()
    with pytest.raises(PydanticValidationError):
        MetricBatchIn.model_validate_json(raw)
    with pytest.raises(RequestValidationError):
        parse_batch(raw)


def test_unix_seconds_round_to_the_microsecond_as_pydantic_does() -> None:
    """The fast path converts numbers itself; pydantic's datetimes for the same numbers are the answer,
    including values whose fraction is exactly half a microsecond (k/128 of a second)."""
    rng = random.Random(14)
    times = [rng.uniform(0, 2e10) for _ in range(2000)] + [rng.uniform(1.7e9, 1.8e9) for _ in range(2000)]
    times += [1764612345 + m / 128 for m in range(1, 128, 2)] + [0.0, 1764612345.9999996]
    body = json.dumps({"points": [{"values": {"t": 1}, "ts": t} for t in times]}).encode()
    model = MetricBatchIn.model_validate_json(body)
    assert decoded(parse_batch(body).rows.stamps) == [point.ts for point in model.points]


def test_more_than_six_fractional_digits_round_as_postgresql_does() -> None:
    """The one kept difference: pydantic truncates to the microsecond, PostgreSQL and msgspec round."""
    body = b'{"points": [{"values": {"a": 1}, "ts": "2026-12-01T10:00:00.1234567Z"}]}'
    assert MetricBatchIn.model_validate_json(body).points[0].ts == datetime(2026, 12, 1, 10, 0, 0, 123456, timezone.utc)
    assert decoded(parse_batch(body).rows.stamps) == [datetime(2026, 12, 1, 10, 0, 0, 123457, timezone.utc)]


def test_the_usual_body_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape trainmaster.log sends never reaches pydantic (the speed of ingest rests on it)."""

    def reference(body: bytes) -> Any:
        raise AssertionError("the reference decoder was used")

    monkeypatch.setattr(batch_module, "_reference", reference)
    points = [{"step": i, "values": {"loss": 0.5, "lr": 1e-3}, "rank": 0, "ts": 1764612345.5 + i} for i in range(100)]
    parsed = parse_batch(json.dumps({"batch_id": str(uuid.uuid4()), "attempt": 1, "points": points}).encode())
    assert len(rows_of(parsed)) == 200 and parsed.latest == {"loss": 0.5, "lr": 1e-3, "step": 99}


def test_nan_and_infinity_are_kept_and_nul_names_refused() -> None:
    parsed = parse_batch(b'{"points": [{"values": {"a": NaN, "b": Infinity, "c": -Infinity}}]}')
    a, b, c = decoded(parsed.rows.values)
    assert a != a and b == float("inf") and c == float("-inf")
    with pytest.raises(ValidationError):
        parse_batch(b'{"points": [{"values": {"a\\u0000b": 1}}]}')
    with pytest.raises(RequestValidationError):
        parse_batch(b'{"points": [{"values": {"a\x00b": 1}}]}')  # unescaped: not JSON
    with pytest.raises(RequestValidationError):
        parse_batch(b'{"points": [')
    assert decoded(parse_batch(b'{"points": [{"values": {"a\\\\u0000": 1}}]}').rows.names) == ["a\\u0000"]


def test_latest_is_rank_zeros_newest_values_and_training_step() -> None:
    points = [
        {"step": 3, "values": {"loss": 0.9}},
        {"step": 4, "values": {"loss": 0.8}, "rank": 1},
        {"step": 2, "values": {"report/epoch": 1}},  # a ray.train.report: its step is an epoch
        {"step": 5, "values": {"loss": 0.7, "acc": 0.5}, "rank": 0},
    ]
    parsed = parse_batch(json.dumps({"points": points}).encode())
    assert parsed.latest == {"loss": 0.7, "acc": 0.5, "report/epoch": 1, "step": 5}
    assert decoded(parsed.rows.ranks) == [0, 1, 0, 0, 0] and decoded(parsed.rows.steps) == [3, 4, 2, 5, 5]
    assert parse_batch(b'{"points": [{"values": {"x": 1}, "rank": 2}]}').latest == {}
