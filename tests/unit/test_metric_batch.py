"""The ingest path validates metric batches into plain dicts (api/metrics/service.py) instead of
MetricBatchIn models: both must accept and refuse the same bodies, and the binary COPY rows must carry
what the points said."""

from __future__ import annotations

import json
import struct
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError as PydanticValidationError

from api.errors import ValidationError
from api.metrics.repository import encode_points
from api.metrics.service import parse_batch
from trainmaster.models import MetricBatchIn

GOOD: list[Any] = [
    {"points": []},
    {"points": [{"values": {"loss": 1}}]},
    {"points": [{"step": 0, "values": {"loss": 1.5, "acc": 2}, "rank": 3, "ts": "2026-12-01T10:00:00+00:00"}]},
    {"batch_id": str(uuid.uuid4()), "attempt": 2, "points": [{"step": None, "values": {}, "ts": None}]},
    {"batch_id": None, "attempt": None, "points": [{"step": 5, "values": {"x" * 256: -1e300}}]},
    {"points": [{"values": {"loss": 1}, "ts": 1764612345.25}]},  # Unix seconds, as trainmaster.log sends
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
]


@pytest.mark.parametrize("body", GOOD)
def test_both_accept(body: Any) -> None:
    raw = json.dumps(body).encode()
    model = MetricBatchIn.model_validate_json(raw)
    parsed = parse_batch(raw)
    assert len(parsed["points"]) == len(model.points)
    for mine, theirs in zip(parsed["points"], model.points, strict=True):
        assert mine["values"] == theirs.values
        assert mine.get("step") == theirs.step and mine.get("rank", 0) == theirs.rank and mine.get("ts") == theirs.ts


@pytest.mark.parametrize("body", BAD, ids=range(len(BAD)))
def test_both_refuse(body: Any) -> None:
    raw = json.dumps(body).encode()
    with pytest.raises(PydanticValidationError):
        MetricBatchIn.model_validate_json(raw)
    with pytest.raises(RequestValidationError):
        parse_batch(raw)


def test_nan_and_infinity_are_kept_and_nul_names_refused() -> None:
    parsed = parse_batch(b'{"points": [{"values": {"a": NaN, "b": Infinity, "c": -Infinity}}]}')
    values = parsed["points"][0]["values"]
    assert values["a"] != values["a"] and values["b"] == float("inf") and values["c"] == float("-inf")
    with pytest.raises(ValidationError):
        parse_batch(b'{"points": [{"values": {"a\\u0000b": 1}}]}')
    with pytest.raises(RequestValidationError):
        parse_batch(b'{"points": [')


def test_binary_rows_carry_every_field() -> None:
    job = uuid.uuid4()
    ts = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=timezone.utc)
    points = [{"step": 7, "values": {"loss": 0.5, "ü": -2.0}, "rank": 1, "ts": ts}, {"values": {"x": 1.0}}]
    payload, rows = encode_points(job, 3, points)
    assert rows == 3
    assert payload.startswith(b"PGCOPY\n\xff\r\n\x00") and payload.endswith(struct.pack(">h", -1))
    body = payload[19:]
    fields, offset = [], 2
    assert struct.unpack_from(">h", body)[0] == 7
    for _ in range(7):
        (length,) = struct.unpack_from(">i", body, offset)
        offset += 4
        fields.append(None if length < 0 else body[offset : offset + length])
        offset += max(length, 0)
    assert uuid.UUID(bytes=fields[0]) == job
    assert struct.unpack(">i", fields[1])[0] == 3 and struct.unpack(">i", fields[2])[0] == 1
    assert struct.unpack(">q", fields[3])[0] == 7 and fields[4] == b"loss"
    assert struct.unpack(">d", fields[5])[0] == 0.5
    micros = struct.unpack(">q", fields[6])[0]
    assert micros == ((ts - datetime(2000, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 1_000_000
