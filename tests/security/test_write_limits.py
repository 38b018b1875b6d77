"""What one job or one project may write into the shared database (api/limits/), through the real app
on a real PostgreSQL: each limit refused with 429 (413 for one request too large) naming the limit, its
value and the setting that raises it; nothing written past it (rows counted); another project's job
writing at the same time unaffected."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.db.session import create_engine, session_factory
from api.dispatcher.backend import RayJobState
from api.logs import repository as logs_repository
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import project_token, scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.factories.world import World, one_worker

Headers = dict[str, str]


@pytest.fixture
def database_url(fresh_database_url: str) -> str:
    return fresh_database_url


@pytest.fixture
def app_with(database_url: str) -> Iterator[Callable[..., TestClient]]:
    """The app in process with these limits (the rest as configured by default)."""
    clients: list[TestClient] = []

    def start(**limits: Any) -> TestClient:
        settings = Settings(database_url=database_url, code_retention_days=None, **limits)
        client = TestClient(create_app(settings), raise_server_exceptions=False)
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def alpha(database_url: str) -> Headers:
    return bearer(project_token(database_url, "alpha"))


@pytest.fixture
def beta(database_url: str) -> Headers:
    return bearer(project_token(database_url, "beta"))


def new_job(http: TestClient, auth: Headers) -> str:
    response = http.post("/v1/jobs", json=spec(), headers=auth)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def count(database_url: str, query: str, *params: Any) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return int(row[0])


def points(database_url: str, job_id: str) -> int:
    return count(database_url, "SELECT count(*) FROM metric_points WHERE job_id = %s", job_id)


def batch(values: int, names: tuple[str, ...] = ("loss",), start: int = 0) -> dict[str, Any]:
    """`values` points' worth of values: one point per step, each with every name."""
    steps = values // len(names)
    return {"points": [{"step": s, "values": dict.fromkeys(names, 1.0)} for s in range(start, start + steps)]}


def post_metrics(http: TestClient, job_id: str, auth: Headers, body: dict[str, Any]) -> Any:
    return http.post(f"/v1/jobs/{job_id}/metrics", json=body, headers=auth)


def assert_refused(response: Any, status: int, text: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == ("LimitExceeded" if status == 429 else "PayloadTooLarge"), body
    assert text in body["detail"], body


def test_metric_points_past_the_job_rate_are_refused_and_other_projects_write_meanwhile(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    # 10 a second, 10 seconds' worth at once: 100 now, then 10 a second.
    http = app_with(metric_points_per_job_per_s=10, write_burst_s=10)
    flooding, other_job, victim = new_job(http, alpha), new_job(http, alpha), new_job(http, beta)
    assert post_metrics(http, flooding, alpha, batch(100)).status_code == 201

    refused = post_metrics(http, flooding, alpha, batch(50, start=100))
    assert_refused(refused, 429, "metric points per job per second: 10 (TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S)")
    assert int(refused.headers["Retry-After"]) >= 1
    assert points(database_url, flooding) == 100

    # The flood goes on while the other project's job (and its own project's other job) write.
    def flood() -> list[int]:
        return [post_metrics(http, flooding, alpha, batch(50)).status_code for _ in range(20)]

    def write(job_id: str, auth: Headers) -> list[int]:
        return [post_metrics(http, job_id, auth, batch(10, start=10 * i)).status_code for i in range(10)]

    with ThreadPoolExecutor(3) as pool:
        flooded = pool.submit(flood)
        written = [pool.submit(write, victim, beta), pool.submit(write, other_job, alpha)]
        assert set(flooded.result()) == {429}
        assert [set(future.result()) for future in written] == [{201}, {201}]
    assert points(database_url, flooding) == 100
    assert points(database_url, victim) == 100 and points(database_url, other_job) == 100


def test_metric_points_past_the_project_rate_are_refused_for_all_its_jobs_only(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with(metric_points_per_project_per_s=10, write_burst_s=10)
    first, second, victim = new_job(http, alpha), new_job(http, alpha), new_job(http, beta)
    assert post_metrics(http, first, alpha, batch(60)).status_code == 201
    refused = post_metrics(http, second, alpha, batch(60))
    assert_refused(
        refused, 429, "metric points per project per second: 10 (TRAINMASTER_METRIC_POINTS_PER_PROJECT_PER_S)"
    )
    assert points(database_url, second) == 0
    assert post_metrics(http, victim, beta, batch(60)).status_code == 201
    assert points(database_url, victim) == 60


def test_one_batch_larger_than_a_rate_lets_through_at_once_is_413(
    app_with: Callable[..., TestClient], alpha: Headers, database_url: str
) -> None:
    http = app_with(metric_points_per_job_per_s=10, write_burst_s=5)
    job_id = new_job(http, alpha)
    refused = post_metrics(http, job_id, alpha, batch(51))
    assert_refused(refused, 413, "(TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S)")
    assert points(database_url, job_id) == 0
    assert post_metrics(http, job_id, alpha, batch(50)).status_code == 201  # the 413 took nothing


def test_metric_names_past_the_job_limit_are_refused_in_this_process_and_the_next(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with(metric_names_per_job=3)
    job_id, victim = new_job(http, alpha), new_job(http, beta)
    assert post_metrics(http, job_id, alpha, batch(2, ("a", "b"))).status_code == 201
    refused = post_metrics(http, job_id, alpha, batch(2, ("c", "d")))
    assert_refused(refused, 429, "metric names per job: 3 (TRAINMASTER_METRIC_NAMES_PER_JOB)")
    assert points(database_url, job_id) == 2
    assert post_metrics(http, job_id, alpha, batch(2, ("a", "c"))).status_code == 201  # the third name fits
    assert post_metrics(http, job_id, alpha, batch(3, ("a", "b", "c"))).status_code == 201  # known names
    assert_refused(post_metrics(http, job_id, alpha, batch(4, ("a", "b", "c", "e"), start=7)), 429, "metric names")
    assert_refused(post_metrics(http, victim, beta, batch(4, ("p", "q", "r", "s"))), 413, "metric names per job: 3")
    assert post_metrics(http, victim, beta, batch(3, ("p", "q", "r"))).status_code == 201
    # Another API process (no names in memory) reads the same limit from the database.
    again = app_with(metric_names_per_job=3)
    assert_refused(post_metrics(again, job_id, alpha, batch(1, ("f",), start=9)), 429, "metric names per job")
    assert post_metrics(again, job_id, alpha, batch(1, ("b",), start=9)).status_code == 201
    assert points(database_url, job_id) == 2 + 2 + 3 + 1


def events_of(database_url: str, job_id: str) -> int:
    return count(database_url, "SELECT count(*) FROM job_events WHERE job_id = %s", job_id)


def post_event(http: TestClient, job_id: str, auth: Headers, kind: str, message: str = "m") -> Any:
    return http.post(f"/v1/jobs/{job_id}/events", json={"kind": kind, "message": message}, headers=auth)


def test_events_past_the_job_total_are_refused_and_a_repeat_still_counts(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    probe = app_with()
    job_id, victim = new_job(probe, alpha), new_job(probe, beta)
    limit = events_of(database_url, job_id) + 2  # what submission wrote, and two more
    http = app_with(events_per_job=limit)
    assert post_event(http, job_id, alpha, "first").status_code == 201
    assert post_event(http, job_id, alpha, "second").status_code == 201
    refused = post_event(http, job_id, alpha, "third")
    assert_refused(refused, 429, f"events per job: {limit} (TRAINMASTER_EVENTS_PER_JOB)")
    assert events_of(database_url, job_id) == limit
    repeat = post_event(http, job_id, alpha, "second")  # the latest again: no new row
    assert repeat.status_code == 201 and repeat.json()["count"] == 2
    assert events_of(database_url, job_id) == limit
    assert post_event(http, victim, beta, "first").status_code == 201


def test_events_past_the_project_rate_are_refused_and_other_projects_post(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with(events_per_project_per_s=1, write_burst_s=3)
    jobs = [new_job(http, alpha) for _ in range(2)]
    victim = new_job(http, beta)
    before = events_of(database_url, jobs[1])
    for kind in ("a", "b", "c"):
        assert post_event(http, jobs[0], alpha, kind).status_code == 201
    refused = post_event(http, jobs[1], alpha, "d")
    assert_refused(refused, 429, "events per project per second: 1 (TRAINMASTER_EVENTS_PER_PROJECT_PER_S)")
    assert "Retry-After" in refused.headers
    assert events_of(database_url, jobs[1]) == before
    assert post_event(http, victim, beta, "a").status_code == 201


def post_checkpoint(http: TestClient, job_id: str, auth: Headers, path: str) -> Any:
    return http.post(f"/v1/jobs/{job_id}/checkpoints", json={"path": path, "step": 1, "metrics": {}}, headers=auth)


def test_checkpoints_past_the_job_limit_are_refused_and_a_path_again_is_not(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with(checkpoints_per_job=2)
    job_id, victim = new_job(http, alpha), new_job(http, beta)
    assert post_checkpoint(http, job_id, alpha, "/ckpt/1").status_code == 204
    assert post_checkpoint(http, job_id, alpha, "/ckpt/2").status_code == 204
    refused = post_checkpoint(http, job_id, alpha, "/ckpt/3")
    assert_refused(refused, 429, "checkpoints per job: 2 (TRAINMASTER_CHECKPOINTS_PER_JOB)")
    assert post_checkpoint(http, job_id, alpha, "/ckpt/1").status_code == 204  # reported again: stores nothing
    assert count(database_url, "SELECT count(*) FROM checkpoints WHERE job_id = %s", job_id) == 2
    assert post_checkpoint(http, victim, beta, "/ckpt/1").status_code == 204


def live_tokens(database_url: str, project: str) -> int:
    return count(
        database_url,
        "SELECT count(*) FROM api_tokens t JOIN projects p ON p.id = t.project_id"
        " WHERE p.name = %s AND t.job_id IS NULL AND t.revoked_at IS NULL",
        project,
    )


def test_tokens_a_project_token_mints_past_the_project_limit_are_refused(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with(tokens_per_project=3)  # alpha's own token is one of them
    for _ in range(2):
        assert http.post("/v1/tokens", json={"description": "ci"}, headers=alpha).status_code == 201
    refused = http.post("/v1/tokens", json={"description": "ci"}, headers=alpha)
    assert_refused(refused, 429, "live tokens per project: 3 (TRAINMASTER_TOKENS_PER_PROJECT)")
    assert live_tokens(database_url, "alpha") == 3
    assert http.post("/v1/tokens", json={"description": "ci"}, headers=beta).status_code == 201
    admin = bearer(scoped_token(database_url, "ops", "admin"))  # an operator's are not the tenant's to count
    assert http.post("/v1/tokens", json={"project": "alpha"}, headers=admin).status_code == 201


def test_log_lines_past_the_job_limit_are_dropped_with_one_line_saying_so(
    app_with: Callable[..., TestClient], alpha: Headers, beta: Headers, database_url: str
) -> None:
    http = app_with()
    job_id, victim = uuid.UUID(new_job(http, alpha)), uuid.UUID(new_job(http, beta))

    async def append(job: uuid.UUID, lines: list[str]) -> None:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session, session.begin():
                await logs_repository.append(session, job, 1, "ray", lines, max_lines=5)
        finally:
            await engine.dispose()

    def stored(job: uuid.UUID) -> list[str]:
        with psycopg.connect(libpq(database_url)) as conn:
            rows = conn.execute("SELECT line FROM log_lines WHERE job_id = %s ORDER BY seq", (job,)).fetchall()
            return [row[0] for row in rows]

    asyncio.run(append(job_id, ["a", "b", "c"]))
    asyncio.run(append(job_id, ["d", "e", "f", "g"]))
    asyncio.run(append(job_id, ["h"]))
    lines = stored(job_id)
    assert lines[:5] == ["a", "b", "c", "d", "e"] and len(lines) == 6
    assert "log lines per job: 5 (TRAINMASTER_LOG_LINES_PER_JOB)" in lines[5]
    asyncio.run(append(victim, ["x"] * 5))
    assert stored(victim) == ["x"] * 5


def test_the_dispatcher_stores_a_jobs_log_lines_up_to_the_limit_and_reads_on(database_url: str) -> None:
    async def scenario() -> tuple[list[str], int, int]:
        async with World(database_url, log_lines_per_job=5) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            sub_id = f"tm-{job_id}-1"
            world.ray.jobs[sub_id] = RayJobState.RUNNING
            world.ray.outputs[sub_id] = "".join(f"line {i}\n" for i in range(3))
            await world.dispatcher().reconcile_round()
            world.ray.outputs[sub_id] += "".join(f"line {i}\n" for i in range(3, 10))
            await world.dispatcher().reconcile_round()
            attempt = (await world.attempts(job_id))[-1]
            with psycopg.connect(libpq(database_url)) as conn:
                query = "SELECT line FROM log_lines WHERE job_id = %s ORDER BY seq"
                lines = [row[0] for row in conn.execute(query, (job_id,)).fetchall()]
            return lines, attempt.log_offset, len(world.ray.outputs[sub_id])

    lines, offset, output = asyncio.run(scenario())
    assert lines[:5] == [f"line {i}" for i in range(5)] and len(lines) == 6
    assert "(TRAINMASTER_LOG_LINES_PER_JOB)" in lines[5]
    assert offset == output  # the dropped lines were read: the next round does not read them again
