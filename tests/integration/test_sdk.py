"""The SDK against the real app in process (httpx transport), on a real PostgreSQL."""

from __future__ import annotations

import threading

import httpx
import psycopg
import pydantic
import pytest
from fastapi.testclient import TestClient

import trainmaster as tm
from api.settings import libpq_url as libpq
from tests.factories.database import finish
from tests.integration.conftest import count_jobs


def test_submit_get_list_cancel_events(sdk: tm.Client) -> None:
    job = sdk.submit(
        name="sdk-job", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=2), labels={"team": "nlp"}
    )
    assert isinstance(job, tm.JobHandle)
    assert job.status is tm.JobStatus.queued
    assert sdk.get(job.id).name == "sdk-job"
    assert [j.id for j in sdk.list(labels={"team": "nlp"})] == [job.id]
    assert job.cancel().status is tm.JobStatus.cancelled
    assert [e.status for e in job.events()] == [tm.JobStatus.queued, tm.JobStatus.cancelled]


def test_list_follows_cursors(sdk: tm.Client) -> None:
    ids = [sdk.submit(name=f"j{i}", entrypoint="builtin:mlp").id for i in range(5)]
    assert [j.id for j in sdk.list(page_size=2)] == list(reversed(ids))
    assert len(list(sdk.list(page_size=2, limit=3))) == 3


def test_a_given_idempotency_key_stores_one_job(sdk: tm.Client, database_url: str) -> None:
    """Two submits with the caller's own key (the retry with lost answers is the test below)."""
    spec = tm.JobSpec(name="same", entrypoint="builtin:mlp")
    first = sdk.submit(spec, idempotency_key="abc")
    second = sdk.submit(spec, idempotency_key="abc")
    assert first.id == second.id
    assert count_jobs(database_url) == 1
    with pytest.raises(tm.ValidationFailed) as caught:
        sdk.submit(tm.JobSpec(name="different", entrypoint="builtin:mlp"), idempotency_key="abc")
    assert caught.value.status_code == 422
    assert "Idempotency-Key" in str(caught.value)


class LosesAnswers(httpx.BaseTransport):
    """Delivers every request to the app, but the first `lose` answers to POST /v1/jobs never arrive
    (the job is stored; the client sees a dropped connection), then one 503 if `busy`."""

    def __init__(self, inner: httpx.BaseTransport, lose: int, busy: bool = False):
        self.inner, self.lose, self.busy = inner, lose, busy
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        submitting = request.method == "POST" and request.url.path == "/v1/jobs"
        if submitting:
            self.keys.append(request.headers.get("Idempotency-Key"))
        if submitting and self.busy:
            self.busy = False
            return httpx.Response(503, json={"error": "DatabaseUnavailable", "detail": "try again"})
        response = self.inner.handle_request(request)
        if submitting and self.lose > 0:
            self.lose -= 1
            response.read()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_submit_retried_after_lost_answers_stores_one_job(http, token: str, database_url: str) -> None:  # type: ignore[no-untyped-def]
    transport = LosesAnswers(http._transport, lose=2, busy=True)
    before = count_jobs(database_url)
    with tm.Client("http://testserver", token, transport=transport) as client:
        job = client.submit(name="flaky-network", entrypoint="builtin:mlp")
        assert client.get(job.id).name == "flaky-network"
    assert len(transport.keys) == 4  # a 503, two lost answers, then the answer that arrived
    assert len(set(transport.keys)) == 1 and transport.keys[0]  # one key generated for every try
    assert count_jobs(database_url) == before + 1


def test_errors_map_to_the_exception_tree(sdk: tm.Client, http, database_url: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(tm.JobNotFound) as missing:
        sdk.get("00000000-0000-0000-0000-000000000000")
    assert isinstance(missing.value, tm.NotFound) and isinstance(missing.value, tm.ApiError)
    assert missing.value.response is not None and missing.value.response.status_code == 404

    job = sdk.submit(name="c", entrypoint="builtin:mlp")
    job.cancel()
    with pytest.raises(tm.Conflict):
        job.cancel()

    with tm.Client("http://testserver", "tm_wrong", transport=http._transport) as bad, pytest.raises(tm.Unauthorized):
        bad.get(job.id)


def test_client_side_validation_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        tm.JobSpec(name="x", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=0))
    assert "num_workers" in str(caught.value)


def test_wait_returns_on_success_and_raises_job_failed(sdk: tm.Client, database_url: str) -> None:
    ok = sdk.submit(name="ok", entrypoint="builtin:mlp")
    timer = threading.Timer(0.3, finish, args=(database_url, ok.id, "succeeded"))
    timer.start()
    assert ok.wait(timeout=10, poll_interval=0.05).status is tm.JobStatus.succeeded

    bad = sdk.submit(name="bad", entrypoint="builtin:mlp")
    finish(database_url, bad.id, "failed", "CUDA out of memory on rank 1")
    with pytest.raises(tm.JobFailed) as caught:
        bad.wait(timeout=10, poll_interval=0.05)
    assert "CUDA out of memory" in str(caught.value)
    assert caught.value.job.status is tm.JobStatus.failed


def test_wait_timeout(sdk: tm.Client) -> None:
    job = sdk.submit(name="slow", entrypoint="builtin:mlp")
    with pytest.raises(tm.WaitTimeout):
        job.wait(timeout=0.2, poll_interval=0.05)


def test_unreachable_api_is_a_clear_connection_error() -> None:
    with tm.Client("http://127.0.0.1:9", "tm_x", timeout=2) as client, pytest.raises(tm.ConnectionFailed) as caught:
        client.get("x")
    assert "trainmaster up" in str(caught.value)


def test_client_ignores_unknown_response_fields() -> None:
    job = tm.Job.model_validate(
        {
            "id": "1",
            "project": "p",
            "name": "n",
            "status": "queued",
            "spec": {},
            "created_at": "2026-01-01T00:00:00Z",
            "a_field_from_the_future": 1,
        }
    )
    assert job.name == "n"


def test_logs_come_back_whole_past_the_first_page(sdk: tm.Client, database_url: str) -> None:
    job = sdk.submit(name="chatty", entrypoint="builtin:mlp")
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(
            "INSERT INTO log_lines (job_id, attempt, source, line)"
            " SELECT %s, 1, 'driver', 'line ' || g FROM generate_series(1, 10500) AS g ORDER BY g",
            (job.id,),
        )
    expected = [f"line {n}" for n in range(1, 10501)]
    assert [line.line for line in job.logs()] == expected  # the API's page is 10,000 lines
    assert [line.line for line in sdk.logs(job.id, page_size=1000)] == expected


class CountsReads(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport):
        self.inner = inner
        self.reads = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/metrics"):
            self.reads += 1
        return self.inner.handle_request(request)


def test_iter_metrics_reads_one_page_at_a_time(http: TestClient, token: str) -> None:
    transport = CountsReads(http._transport)
    with tm.Client("http://testserver", token, transport=transport) as client:
        job = client.submit(name="many-points", entrypoint="builtin:mlp")
        points = [{"step": step, "values": {"loss": 0.5, "lr": 0.1}} for step in range(25)]
        response = http.post(f"/v1/jobs/{job.id}/metrics", json={"points": points}, headers=client._http.headers)
        assert response.status_code == 201
        values = job.iter_metrics(page_size=7)
        first = next(values)
        assert transport.reads == 1  # one page read, not all 50 values
        rest = list(values)
        assert transport.reads == 8  # 7 full pages of 7, then 1 value
        seqs = [value.seq for value in [first, *rest]]
        assert len(seqs) == 50 and seqs == sorted(set(seqs))
        assert [value.seq for value in client.metrics(job.id)] == seqs  # the list, as before
