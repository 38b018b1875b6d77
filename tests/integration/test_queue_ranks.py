"""Queue positions read through each API process's rank cache (api/queues/ranks.py) stay the admission
order whatever moves the queue, with the cache warm: submissions, cancellation, a priority or status
changed by hand, a job with an older created_at arriving late, TRUNCATE. Every read is compared to
the dispatcher's own claim order, and the cache is shown to answer (its hit count grows)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct
from api.queues import repository as queues_repository
from api.queues.ranks import QueueRanks
from api.settings import Settings
from tests.factories.database import in_session, sql
from tests.factories.http import submit


def claim_order(database_url: str) -> list[str]:
    async def claim(session: AsyncSession) -> list[str]:
        return [str(row.id) for row in await queues_repository.lock_queued(session, 1000)]

    return in_session(database_url, claim)


def positions(http: TestClient, auth: dict[str, str], ids: list[str]) -> dict[str, int | None]:
    return {job_id: http.get(f"/v1/jobs/{job_id}", headers=auth).json()["queue_position"] for job_id in ids}


def assert_admission_order(http: TestClient, auth: dict[str, str], ids: list[str], database_url: str) -> None:
    order = claim_order(database_url)
    read = positions(http, auth, ids)
    assert {job_id: place for job_id, place in read.items() if place is not None} == {
        job_id: order.index(job_id) + 1 for job_id in ids if job_id in order
    }


def listening(ranks: QueueRanks) -> None:
    deadline = time.monotonic() + 10
    while not ranks.listening:
        assert time.monotonic() < deadline, "the API's LISTEN connection did not come up"
        time.sleep(0.02)


def test_positions_from_the_warm_cache_follow_every_change(
    http: TestClient, token: str, auth: dict[str, str], database_url: str
) -> None:
    ranks: QueueRanks = http.app.state.ranks  # type: ignore[attr-defined]
    listening(ranks)
    ids = [submit(http, token) for _ in range(8)]
    assert positions(http, auth, ids) == {job_id: n + 1 for n, job_id in enumerate(ids)}
    hits = ranks.hits
    assert positions(http, auth, ids) == {job_id: n + 1 for n, job_id in enumerate(ids)}
    assert ranks.hits == hits + len(ids)  # the second round came from the cache

    # Cancelled through the API, read at once: the jobs behind it move up.
    assert http.post(f"/v1/jobs/{ids[1]}/cancel", headers=auth).status_code == 202
    assert positions(http, auth, ids)[ids[1]] is None
    assert_admission_order(http, auth, ids, database_url)

    # Changed by hand (no API involved): a priority, a job taken and put back (a retry), a late arrival.
    sql(database_url, "UPDATE jobs SET priority = 3 WHERE id = %s", (ids[5],))
    assert_admission_order(http, auth, ids, database_url)
    sql(database_url, "UPDATE jobs SET status = 'starting' WHERE id = %s", (ids[0],))
    assert_admission_order(http, auth, ids, database_url)
    sql(database_url, "UPDATE jobs SET status = 'queued' WHERE id = %s", (ids[0],))
    assert_admission_order(http, auth, ids, database_url)
    late = submit(http, token)
    sql(database_url, "UPDATE jobs SET status = 'starting' WHERE id = %s", (late,))
    sql(database_url, "UPDATE jobs SET created_at = created_at - interval '1 hour' WHERE id = %s", (late,))
    assert_admission_order(http, auth, [*ids, late], database_url)
    sql(database_url, "UPDATE jobs SET status = 'queued' WHERE id = %s", (late,))  # older than every job
    assert positions(http, auth, [late])[late] == 2  # behind the priority-3 job only
    assert_admission_order(http, auth, [*ids, late], database_url)

    hits = ranks.hits
    assert_admission_order(http, auth, [*ids, late], database_url)
    assert ranks.hits > hits

    sql(database_url, "TRUNCATE jobs CASCADE")
    deadline = time.monotonic() + 10
    while ranks.group_of:  # the '*' notice empties it
        assert time.monotonic() < deadline, "TRUNCATE's notice did not empty the rank cache"
        time.sleep(0.02)


@pytest.mark.parametrize("newer_cap", [1000, 4, 1])
def test_a_count_made_in_postgresql_from_either_end_is_the_claim_order(
    http: TestClient, token: str, other_token: str, database_url: str, newer_cap: int
) -> None:
    """The count READ_JOB makes when no cache knows it: from the newer end (the maintained count less
    the newer jobs) while fewer than `newer_cap` are newer, else from the older end; two projects that
    hold nothing are tied and interleave by age; priorities and a cancelled job in between."""
    ids = []
    for n in range(12):
        ids.append(submit(http, token if n % 3 else other_token, **({"priority": 2} if n % 5 == 4 else {})))
    sql(database_url, "UPDATE jobs SET status = 'cancelled' WHERE id = %s", (ids[6],))
    order = claim_order(database_url)
    project_of = dict(sql(database_url, "SELECT id::text, project_id FROM jobs"))

    async def read_all() -> dict[str, int | None]:
        direct = Direct(Settings(database_url=database_url))
        await direct.open()
        try:
            found = {}
            for job_id in ids:
                row = await queues_repository.read_job(
                    direct, uuid.UUID(job_id), project_of[job_id], newer_cap=newer_cap
                )
                assert row is not None
                found[job_id] = row[11]
            return found
        finally:
            await direct.close()

    read = asyncio.run(read_all())
    assert read == {job_id: (order.index(job_id) + 1 if job_id in order else None) for job_id in ids}
