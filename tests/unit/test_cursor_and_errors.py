from __future__ import annotations

import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import httpx
import pytest

from api.errors import ValidationError
from api.jobs.service import decode_cursor, encode_cursor, parse_labels
from trainmaster import errors


def test_cursor_round_trip() -> None:
    job = SimpleNamespace(created_at=datetime(2026, 11, 30, 7, 0, 1, 123456, tzinfo=timezone.utc), id=uuid.uuid4())
    assert decode_cursor(encode_cursor(job)) == (job.created_at, job.id)  # type: ignore[arg-type]


@pytest.mark.parametrize("cursor", ["", "x", "e30", "WyJhIiwiYiJd", "W10"])
def test_garbage_cursor(cursor: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decode_cursor(cursor)
    assert caught.value.detail[0]["loc"] == ["query", "cursor"]


def test_labels() -> None:
    assert parse_labels(["a:b", "c:d:e"]) == {"a": "b", "c": "d:e"}
    with pytest.raises(ValidationError):
        parse_labels(["nope"])


@pytest.mark.parametrize(
    ("status", "name", "expected"),
    [
        (401, "Unauthorized", errors.Unauthorized),
        (404, "JobNotFound", errors.JobNotFound),
        (409, "IllegalTransition", errors.Conflict),
        (413, "PayloadTooLarge", errors.PayloadTooLarge),
        (422, "ValidationError", errors.ValidationFailed),
        (503, "DatabaseUnavailable", errors.ServiceUnavailable),
        (500, "Boom", errors.ServerError),
    ],
)
def test_sdk_error_mapping(status: int, name: str, expected: type) -> None:
    response = httpx.Response(status, json={"error": name, "detail": [{"loc": ["body", "name"], "msg": "bad"}]})
    error = errors.error_from_response(response)
    assert type(error) is expected
    assert error.response is response
    assert "name: bad" in str(error)
