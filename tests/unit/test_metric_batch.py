"""The ingest path validates metric batches into plain dicts (api/metrics/service.py) instead of
MetricBatchIn models: both must accept and refuse the same bodies, and the binary COPY rows must carry
what the points said."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError as PydanticValidationError

from api.errors import ValidationError
from api.metrics.repository import columns
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


def test_rows_carry_every_field() -> None:
    ts = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=timezone.utc)
    naive = datetime(2026, 12, 1, 11, 0, 0)
    points = [
        {"step": 7, "values": {"loss": 0.5, "ü": -2.0}, "rank": 1, "ts": ts},
        {"values": {"x": 1.0}},
        {"step": 8, "values": {"y": 2.0}, "ts": naive},
    ]
    before = datetime.now(timezone.utc)
    rows = columns(points)
    assert rows.ranks == [1, 1, 0, 0] and rows.steps == [7, 7, None, 8]
    assert rows.names == ["loss", "ü", "x", "y"] and rows.values == [0.5, -2.0, 1.0, 2.0]
    assert rows.stamps[:2] == [ts, ts] and rows.stamps[2] >= before  # no time: the time it arrived
    assert rows.stamps[3] == naive.replace(tzinfo=timezone.utc)  # no offset: UTC
