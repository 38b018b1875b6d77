"""A job stream sends every stored row before `end`, however the job's last writes and its end interleave
with the stream's reads."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession

import api.logs.service
import api.metrics.service
from api.settings import libpq_url as libpq
from tests.factories.jobs import spec
from trainmaster.sse import parse

LAST_ROWS = 5

# The last rows of a job and its terminal status, committed together the way a driver's final flush
# and the reconcile loop's status write land within moments of each other.
FINAL_WRITES = {
    "logs": (
        "INSERT INTO log_lines (job_id, source, line)"
        " SELECT %(job)s, 'driver', 'line ' || n FROM generate_series(1, %(n)s) n"
    ),
    "metrics": (
        "INSERT INTO metric_points (job_id, rank, step, name, value)"
        " SELECT %(job)s, 0, n, 'loss', 1.0 / n FROM generate_series(1, %(n)s) n"
    ),
}


def finish_with_last_rows(database_url: str, kind: str, job_id: uuid.UUID) -> None:
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(FINAL_WRITES[kind], {"job": str(job_id), "n": LAST_ROWS})
        conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = %s", (str(job_id),))
        conn.execute("SELECT pg_notify('tm_jobs', %s)", (json.dumps({"job_id": str(job_id)}),))


@pytest.mark.parametrize("kind", ["logs", "metrics"])
def test_end_comes_after_rows_written_while_the_stream_was_reading(
    http: TestClient, auth: dict[str, str], database_url: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The job writes its last rows and becomes terminal right after the stream read its rows and
    found none new: the stream still delivers those rows, then `end`."""
    service: Any = api.logs.service if kind == "logs" else api.metrics.service
    read_for_stream = service.read_for_stream
    finished = False

    async def read_then_finish(session: AsyncSession, job_id: uuid.UUID, after_seq: int) -> tuple[list[Any], int]:
        nonlocal finished
        items, newest = await read_for_stream(session, job_id, after_seq)
        if not items and not finished:
            finished = True
            finish_with_last_rows(database_url, kind, job_id)
        return items, newest

    monkeypatch.setattr(service, "read_for_stream", read_then_finish)
    job_id = http.post("/v1/jobs", json=spec(), headers=auth).json()["id"]
    events = []
    with http.stream("GET", f"/v1/jobs/{job_id}/{kind}/stream", headers=auth) as response:
        assert response.status_code == 200
        for event in parse(response.iter_lines()):
            events.append(event)
            if event.event == "end":
                break
    assert finished
    delivered = [item for event in events if event.event == kind for item in event.data["items"]]
    assert len(delivered) == LAST_ROWS, [e.event for e in events]
    assert [e.event for e in events][-2:] == ["status", "end"]
    assert events[-1].data == {"status": "succeeded"}
    assert events[-1].id == str(max(item["seq"] for item in delivered))
