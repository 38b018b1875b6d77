"""A job's events stay bounded: the same event right after itself is counted on one row, not stored again."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
from fastapi.testclient import TestClient

from api.db.models import Job
from api.db.session import create_engine, session_factory
from api.jobs.status import record_event
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.jobs import spec

REPEATS = 1000


def stored_events(database_url: str, job_id: str) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM job_events WHERE job_id = %s", (job_id,)).fetchone()
        assert row is not None
        return int(row[0])


def record(
    settings: Settings, job_id: str, kind: str, message: str, times: int, data: dict[str, int] | None = None
) -> None:
    """`times` events, up to 100 in a transaction (the dispatcher records one or two per transaction:
    the row is found the same way within one and across them)."""

    async def run() -> None:
        engine = create_engine(settings)
        sessions = session_factory(engine)
        try:
            for start in range(0, times, 100):
                async with sessions() as session, session.begin():
                    job = await session.get(Job, uuid.UUID(job_id))
                    assert job is not None
                    for _ in range(start, min(times, start + 100)):
                        await record_event(session, job, kind, message, data)
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_the_same_event_a_thousand_times_is_one_row_with_its_count(
    http: TestClient, auth: dict[str, str], settings: Settings, database_url: str
) -> None:
    job_id = http.post("/v1/jobs", json=spec(), headers=auth).json()["id"]
    before = stored_events(database_url, job_id)  # the submission's status event

    record(settings, job_id, "infeasible", "needs 4 GPU; cluster has 2", REPEATS)
    assert stored_events(database_url, job_id) == before + 1

    record(settings, job_id, "infeasible", "needs 4 GPU; cluster has 3", 2)  # something new: a row of its own
    record(settings, job_id, "infeasible", "needs 4 GPU; cluster has 3", 1, data={"round": 7})  # other data too
    record(settings, job_id, "infeasible", "needs 4 GPU; cluster has 2", 1)  # again, but not right after itself
    assert stored_events(database_url, job_id) == before + 4

    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["items"]
    assert [(e["kind"], e["count"]) for e in events] == [
        ("status", 1),
        ("infeasible", REPEATS),
        ("infeasible", 2),
        ("infeasible", 1),
        ("infeasible", 1),
    ]
    repeated = events[1]
    assert repeated["message"] == "needs 4 GPU; cluster has 2"
    assert repeated["last_at"] > repeated["created_at"]
    assert events[0]["last_at"] is None and events[-1]["last_at"] is None


def test_an_event_posted_again_by_the_job_answers_the_counted_row(http: TestClient, auth: dict[str, str]) -> None:
    job_id = http.post("/v1/jobs", json=spec(), headers=auth).json()["id"]
    body = {"kind": "dropped_points", "message": "buffer full", "data": {"rank": 0}}
    answers = [http.post(f"/v1/jobs/{job_id}/events", json=body, headers=auth) for _ in range(3)]
    assert all(answer.status_code == 201 for answer in answers), answers[0].text
    assert [answer.json()["count"] for answer in answers] == [1, 2, 3]
    assert len({answer.json()["id"] for answer in answers}) == 1
    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["items"]
    assert [(e["kind"], e["count"]) for e in events] == [("status", 1), ("dropped_points", 3)]
