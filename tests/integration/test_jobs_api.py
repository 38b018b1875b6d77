from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
from fastapi.testclient import TestClient

from api.settings import libpq_url as libpq
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.integration.conftest import count_jobs


def submit(http: TestClient, auth: dict[str, str], **overrides: object) -> dict:
    response = http.post("/v1/jobs", json=spec(**overrides), headers=auth)
    assert response.status_code == 201, response.text
    return response.json()


def test_submit_stores_queued_job_with_event(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job = submit(http, auth, name="first", labels={"team": "vision"})
    assert job["status"] == "queued"
    assert job["project"] == "alpha"
    assert job["queue_position"] == 1
    assert job["spec"]["scaling"]["num_workers"] == 2

    fetched = http.get(f"/v1/jobs/{job['id']}", headers=auth).json()
    assert fetched["id"] == job["id"] and fetched["name"] == "first"

    events = http.get(f"/v1/jobs/{job['id']}/events", headers=auth).json()["items"]
    assert [(e["kind"], e["status"]) for e in events] == [("status", "queued")]
    assert count_jobs(database_url) == 1


def test_list_is_newest_first_filters_and_pages(http: TestClient, auth: dict[str, str]) -> None:
    ids = [submit(http, auth, name=f"job-{i}", labels={"k": "even" if i % 2 == 0 else "odd"})["id"] for i in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/jobs", params=params, headers=auth).json()
        assert len(page["items"]) <= 3
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))

    even = http.get("/v1/jobs", params={"label": "k:even"}, headers=auth).json()["items"]
    assert [j["id"] for j in even] == [ids[6], ids[4], ids[2], ids[0]]

    http.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth)
    cancelled = http.get("/v1/jobs", params={"status": "cancelled"}, headers=auth).json()["items"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    both = http.get("/v1/jobs", params=[("status", "cancelled"), ("status", "queued")], headers=auth).json()
    assert len(both["items"]) == 7


def test_queue_position_follows_priority_then_age(http: TestClient, auth: dict[str, str]) -> None:
    low = submit(http, auth, name="low")
    high = submit(http, auth, name="high", priority=50)
    assert http.get(f"/v1/jobs/{high['id']}", headers=auth).json()["queue_position"] == 1
    assert http.get(f"/v1/jobs/{low['id']}", headers=auth).json()["queue_position"] == 2


def test_queue_position_is_the_admission_order_with_fair_share(
    http: TestClient, auth: dict[str, str], other_token: str, database_url: str
) -> None:
    beta = bearer(other_token)
    busy = submit(http, auth, name="alpha-running")
    with psycopg.connect(libpq(database_url)) as conn:  # alpha already holds a running gang
        conn.execute("UPDATE jobs SET status = 'running' WHERE id = %s", (busy["id"],))
    alpha_older = submit(http, auth, name="alpha-older")
    beta_newer = submit(http, beta, name="beta-newer")
    # Admission takes beta first (it holds nothing), so beta's job is first in the queue.
    assert http.get(f"/v1/jobs/{beta_newer['id']}", headers=beta).json()["queue_position"] == 1
    assert http.get(f"/v1/jobs/{alpha_older['id']}", headers=auth).json()["queue_position"] == 2


def test_cancel_queued_is_immediate_and_cancel_of_finished_is_409(http: TestClient, auth: dict[str, str]) -> None:
    job = submit(http, auth)
    response = http.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"] is not None

    again = http.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert again.status_code == 409
    assert again.json()["error"] == "IllegalTransition"
    assert "cancelled" in again.json()["detail"]
    statuses = [e["status"] for e in http.get(f"/v1/jobs/{job['id']}/events", headers=auth).json()["items"]]
    assert statuses == ["queued", "cancelled"]


def test_cancel_running_goes_through_cancelling(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job = submit(http, auth)
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute("UPDATE jobs SET status = 'running' WHERE id = %s", (job["id"],))
    response = http.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert response.json()["status"] == "cancelling"
    assert http.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelling"


def test_idempotency_key_returns_same_job_and_refuses_other_body(
    http: TestClient, auth: dict[str, str], other_token: str, database_url: str
) -> None:
    headers = {**auth, "Idempotency-Key": "run-42"}
    first = http.post("/v1/jobs", json=spec(), headers=headers)
    second = http.post("/v1/jobs", json=spec(), headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"

    different = http.post("/v1/jobs", json=spec(name="other"), headers=headers)
    assert different.status_code == 422
    assert different.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]

    foreign = http.post("/v1/jobs", json=spec(), headers={**bearer(other_token), "Idempotency-Key": "run-42"})
    assert foreign.status_code == 201 and foreign.json()["id"] != first.json()["id"]
    assert count_jobs(database_url) == 2


def test_idempotency_key_under_concurrency_makes_one_job(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    headers = {**auth, "Idempotency-Key": f"burst-{uuid.uuid4()}"}
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: http.post("/v1/jobs", json=spec(), headers=headers), range(10)))
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    assert count_jobs(database_url) == 1


def test_auth_missing_bad_and_cross_project(http: TestClient, auth: dict[str, str], other_token: str) -> None:
    job = submit(http, auth)
    assert http.get("/v1/jobs").status_code == 401
    assert http.get("/v1/jobs", headers={"Authorization": "Bearer tm_nope"}).status_code == 401
    assert http.get("/v1/jobs", headers={"Authorization": "Basic abc"}).status_code == 401
    other = bearer(other_token)
    for method, path in (
        ("GET", f"/v1/jobs/{job['id']}"),
        ("GET", f"/v1/jobs/{job['id']}/events"),
        ("POST", f"/v1/jobs/{job['id']}/cancel"),
    ):
        response = http.request(method, path, headers=other)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"] == "JobNotFound"
    assert http.get("/v1/jobs", headers=other).json()["items"] == []
    assert http.get(f"/v1/jobs/{job['id']}", headers=auth).json()["status"] == "queued"


def test_unknown_and_malformed_job_ids_are_404(http: TestClient, auth: dict[str, str]) -> None:
    assert http.get(f"/v1/jobs/{uuid.uuid4()}", headers=auth).status_code == 404
    assert http.get("/v1/jobs/not-a-uuid", headers=auth).status_code == 404


def test_health_ready_and_prometheus(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    from tests.factories.auth import scoped_token

    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").status_code == 200
    submit(http, auth)
    http.get("/v1/jobs", headers=auth)
    scraper = bearer(scoped_token(database_url, "ops", "metrics"))
    text = http.get("/metrics", headers=scraper).text
    assert 'trainmaster_jobs{status="queued"} 1.0' in text
    assert 'trainmaster_http_requests_total{method="POST",route="/v1/jobs",status="201"} 1.0' in text
    assert 'route="/v1/jobs",status="200"' in text


def test_status_machine_refuses_illegal_transition_and_writes_events(
    database_url: str, http: TestClient, auth: dict[str, str]
) -> None:
    from api.db.models import Job
    from api.db.session import create_engine, session_factory
    from api.errors import IllegalTransition
    from api.jobs.status import transition
    from api.settings import Settings
    from trainmaster.models import JobStatus

    job_id = submit(http, auth)["id"]

    async def run() -> None:
        engine = create_engine(Settings(database_url=database_url))
        async with session_factory(engine)() as session:
            row = await session.get(Job, uuid.UUID(job_id))
            assert row is not None
            await transition(session, row, JobStatus.starting, message="claimed")
            await transition(session, row, JobStatus.running)
            try:
                await transition(session, row, JobStatus.starting)
                raise AssertionError("running -> starting must be refused")
            except IllegalTransition as exc:
                assert "running" in str(exc.detail)
            await transition(session, row, JobStatus.succeeded)
            await session.commit()
        await engine.dispose()

    asyncio.run(run())
    job = http.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "succeeded" and job["started_at"] and job["finished_at"]
    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["items"]
    assert [e["status"] for e in events] == ["queued", "starting", "running", "succeeded"]
    assert events[1]["data"]["from"] == "queued"


def test_cluster_reports_an_unreachable_ray_and_the_queue(settings, auth: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    from api.app import create_app

    nowhere = settings.model_copy(update={"ray_address": "http://127.0.0.1:9"})
    with TestClient(create_app(nowhere)) as http:
        submit(http, auth)
        submit(http, auth)
        info = http.get("/v1/cluster", headers=auth).json()
        assert info["reachable"] is False and "127.0.0.1:9" in info["error"]
        assert info["queue_depth"] == 2 and info["project_queue_depth"] == 2
        assert http.get("/v1/cluster").status_code == 401
