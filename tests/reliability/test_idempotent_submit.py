"""Case 1: one Idempotency-Key, serially and 10x at once, gives one job and identical answers."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg

from api.settings import libpq_url as libpq
from tests.e2e.conftest import ApiProcess
from tests.factories.auth import project_token
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.factories.waiting import wait_until


def submit(api: ApiProcess, token: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{api.url}/v1/jobs", json=body, headers={**bearer(token), "Idempotency-Key": key}, timeout=30)


def test_serial_and_concurrent_retries_make_one_job(strict_api: ApiProcess, database_url: str) -> None:
    key = f"rel-{uuid.uuid4()}"
    body = spec(name="idempotent")
    serial = [submit(strict_api, strict_api.token, key, body) for _ in range(3)]
    with ThreadPoolExecutor(10) as pool:
        burst = list(pool.map(lambda _: submit(strict_api, strict_api.token, key, body), range(10)))
    answers = serial + burst
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    # Identical answers (the queue position may move as other jobs come and go).
    assert len({json.dumps({k: v for k, v in a.json().items() if k != "queue_position"}) for a in answers}) == 1

    other_body = submit(strict_api, strict_api.token, key, spec(name="another"))
    assert other_body.status_code == 422
    assert other_body.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]

    other_project = project_token(database_url, f"other-{uuid.uuid4().hex[:6]}")
    theirs = submit(strict_api, other_project, key, body)
    assert theirs.status_code == 201 and theirs.json()["id"] != answers[0].json()["id"]

    listed = httpx.get(
        f"{strict_api.url}/v1/jobs", params={"limit": 100}, headers=bearer(strict_api.token), timeout=30
    ).json()["items"]
    assert sum(1 for job in listed if job["name"] == "idempotent") == 1


def test_a_submit_cut_off_mid_insert_answers_503_naming_the_job_and_a_retry_makes_one(
    strict_api: ApiProcess, database_url: str
) -> None:
    """The API's connection is killed while its INSERT waits (on a lock this test holds): whether the
    row committed is unknowable then, so the 503 names the job, and the same key settles it."""
    key, body = f"doubt-{uuid.uuid4()}", spec(name=f"doubt-{uuid.uuid4().hex[:8]}")
    with (
        ThreadPoolExecutor(1) as pool,
        psycopg.connect(libpq(database_url)) as locker,
        psycopg.connect(libpq(database_url), autocommit=True) as watcher,  # a fresh pg_stat_activity each time
    ):
        locker.execute("LOCK TABLE jobs IN SHARE MODE")  # lets reads through, holds every INSERT
        answer = pool.submit(submit, strict_api, strict_api.token, key, body)

        def waiting_insert() -> int | None:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE '%INSERT INTO jobs%'"
            ).fetchone()
            return row[0] if row else None

        pid = wait_until(waiting_insert, 30, what="the API's INSERT to wait on the lock")
        watcher.execute("SELECT pg_terminate_backend(%s)", [pid])
        cut = answer.result(timeout=30)
        locker.rollback()

    assert cut.status_code == 503, cut.text
    job_path = cut.headers["Location"]
    assert job_path.startswith("/v1/jobs/") and job_path.removeprefix("/v1/jobs/") in cut.json()["detail"]
    assert "Idempotency-Key" in cut.json()["detail"]
    assert httpx.get(f"{strict_api.url}{job_path}", headers=bearer(strict_api.token), timeout=30).status_code == 404

    retried = [submit(strict_api, strict_api.token, key, body) for _ in range(2)]
    assert [r.status_code for r in retried] == [201, 201]
    assert retried[0].json()["id"] == retried[1].json()["id"] and retried[1].headers["Idempotent-Replayed"] == "true"
    with psycopg.connect(libpq(database_url)) as conn:
        stored = conn.execute("SELECT count(*) FROM jobs WHERE name = %s", [body["name"]]).fetchone()
    assert stored == (1,)
