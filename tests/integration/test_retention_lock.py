"""Retention's purge lock never outlives its pass, even when the pass shares its connection pool with
requests in flight and when it raises midway."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.db.session import create_engine, session_factory
from api.retention import repository
from api.retention.repository import RETENTION_LOCK
from api.retention.service import purge_round
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.jobs import spec


def finished_long_ago(http: TestClient, auth: dict[str, str], database_url: str) -> str:
    job_id = str(http.post("/v1/jobs", json=spec(), headers=auth).json()["id"])
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '10 days' WHERE id = %s", (job_id,)
        )
        conn.execute("INSERT INTO log_lines (job_id, source, line) VALUES (%s, 'driver', 'x')", (job_id,))
    return job_id


def another_replica_can_take_the_lock(database_url: str) -> bool:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (RETENTION_LOCK,)).fetchone()
        assert row is not None
        return bool(row[0])  # the connection closes here, and the lock with it


@pytest.mark.parametrize("raises", [False, True], ids=["pass-completes", "pass-raises"])
def test_the_lock_is_free_after_a_pass_that_shares_its_pool_with_requests(
    http: TestClient,
    auth: dict[str, str],
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    raises: bool,
) -> None:
    """While the pass runs, a request checks out a connection from the same pool and is still using it
    when the pass ends (in the API, retention shares the engine with every request)."""
    first = finished_long_ago(http, auth, database_url)
    expired_jobs = repository.expired_jobs
    requests: list[AsyncSession] = []
    sessions: async_sessionmaker[AsyncSession]

    async def expired_jobs_beside_a_request(session: AsyncSession, days: float, limit: int) -> list[uuid.UUID]:
        request = sessions()
        requests.append(request)
        await request.execute(text("SELECT 1"))
        if raises:
            raise RuntimeError("database hiccup")
        return await expired_jobs(session, days, limit)

    async def one_pass(days: float) -> Any:
        nonlocal sessions
        engine = create_engine(Settings(database_url=database_url))
        sessions = session_factory(engine)
        try:
            try:
                return await purge_round(sessions, days=days, batch=100)
            finally:
                lock_free = await asyncio.to_thread(another_replica_can_take_the_lock, database_url)
                for request in requests:
                    await request.close()
                assert lock_free, "the purge lock outlived its pass"
        finally:
            await engine.dispose()

    monkeypatch.setattr(repository, "expired_jobs", expired_jobs_beside_a_request)
    if raises:
        with pytest.raises(RuntimeError, match="hiccup"):
            asyncio.run(one_pass(7))
    else:
        assert asyncio.run(one_pass(7)).jobs == 1
    assert requests

    monkeypatch.setattr(repository, "expired_jobs", expired_jobs)
    second = finished_long_ago(http, auth, database_url)
    purged = asyncio.run(purge_round_alone(database_url))
    assert purged.jobs == (2 if raises else 1)  # the next pass takes the lock and does the work
    with psycopg.connect(libpq(database_url)) as conn:
        unpurged = conn.execute("SELECT count(*) FROM jobs WHERE purged_at IS NULL AND id IN (%s, %s)", (first, second))
        assert unpurged.fetchone() == (0,)
    assert another_replica_can_take_the_lock(database_url)


async def purge_round_alone(database_url: str) -> Any:
    engine = create_engine(Settings(database_url=database_url))
    try:
        return await purge_round(session_factory(engine), days=7, batch=100)
    finally:
        await engine.dispose()
