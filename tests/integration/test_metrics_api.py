"""Metrics, logs and checkpoints through the real app on a real PostgreSQL, SSE included."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import job_token
from tests.factories.http import bearer
from tests.factories.jobs import spec
from trainmaster.context import JobApi
from trainmaster.metrics import MetricsSender
from trainmaster.sse import parse


def new_job(http: TestClient, auth: dict[str, str]) -> str:
    response = http.post("/v1/jobs", json=spec(), headers=auth)
    assert response.status_code == 201
    return str(response.json()["id"])


def points(start: int, count: int, rank: int = 0) -> list[dict[str, Any]]:
    return [
        {"step": s, "values": {"loss": 1.0 / (s + 1), "lr": 0.1}, "rank": rank} for s in range(start, start + count)
    ]


def post(http: TestClient, job_id: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
    return http.post(f"/v1/jobs/{job_id}/metrics", json=body, headers=headers)


def stored_rows(database_url: str, job_id: str) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM metric_points WHERE job_id = %s", (job_id,)).fetchone()
        assert row is not None
        return int(row[0])


def test_ingest_read_and_latest_metrics(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job_id = new_job(http, auth)
    response = post(http, job_id, auth, {"points": points(0, 10)})
    assert response.status_code == 201 and response.json()["stored"] == 20
    items = http.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss"}, headers=auth).json()["items"]
    assert [i["step"] for i in items] == list(range(10))
    assert items[-1]["value"] == 0.1
    assert [i["seq"] for i in items] == sorted(i["seq"] for i in items)
    job = http.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["latest_metrics"] == {"loss": 0.1, "lr": 0.1, "step": 9}
    since = http.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss", "since_step": 7}, headers=auth).json()
    assert [i["step"] for i in since["items"]] == [7, 8, 9]


def test_retried_batch_is_stored_once(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job_id = new_job(http, auth)
    body = {"batch_id": str(uuid.uuid4()), "points": points(0, 5)}
    assert post(http, job_id, auth, body).json() == {"stored": 10, "duplicate": False}
    assert post(http, job_id, auth, body).json() == {"stored": 0, "duplicate": True}
    assert stored_rows(database_url, job_id) == 10


def test_nan_is_kept_and_served_as_null(http: TestClient, auth: dict[str, str]) -> None:
    job_id = new_job(http, auth)
    raw = '{"points": [{"step": 1, "values": {"loss": NaN}}, {"step": 2, "values": {"loss": Infinity}}]}'
    response = http.post(
        f"/v1/jobs/{job_id}/metrics", content=raw, headers={**auth, "Content-Type": "application/json"}
    )
    assert response.status_code == 201
    items = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth).json()["items"]
    assert [i["value"] for i in items] == [None, None]


def test_downsampling_keeps_minima_and_maxima(http: TestClient, auth: dict[str, str]) -> None:
    job_id = new_job(http, auth)
    values = [math.sin(i / 10) for i in range(1000)]
    values[500] = -50.0  # a spike a chart must not lose
    values[700] = 80.0
    body = {"points": [{"step": i, "values": {"x": v}} for i, v in enumerate(values)]}
    assert post(http, job_id, auth, body).status_code == 201
    items = http.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 100}, headers=auth).json()["items"]
    assert 50 <= len(items) <= 100
    kept = [i["value"] for i in items]
    assert -50.0 in kept and 80.0 in kept
    assert [i["step"] for i in items] == sorted(i["step"] for i in items)


def test_job_token_writes_only_its_own_job_and_reads_nothing(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    job_a, job_b = new_job(http, auth), new_job(http, auth)
    token_a = bearer(job_token(database_url, job_a))
    assert post(http, job_a, token_a, {"points": points(0, 1)}).status_code == 201
    assert post(http, job_b, token_a, {"points": points(0, 1)}).status_code == 404
    assert stored_rows(database_url, job_b) == 0
    for path in (f"/v1/jobs/{job_a}", f"/v1/jobs/{job_a}/metrics", "/v1/jobs", f"/v1/jobs/{job_a}/logs"):
        assert http.get(path, headers=token_a).status_code == 401, path
    event = {"kind": "runtime", "message": "m", "data": {"backend": "gloo"}}
    assert http.post(f"/v1/jobs/{job_a}/events", json=event, headers=token_a).status_code == 201
    assert http.post(f"/v1/jobs/{job_b}/events", json=event, headers=token_a).status_code == 404
    status_event = {"kind": "status", "message": "forged"}
    assert http.post(f"/v1/jobs/{job_a}/events", json=status_event, headers=token_a).status_code == 422


def test_other_project_cannot_read_or_write(http: TestClient, auth: dict[str, str], other_token: str) -> None:
    job_id = new_job(http, auth)
    other = bearer(other_token)
    assert post(http, job_id, other, {"points": points(0, 1)}).status_code == 404
    for path in ("metrics", "metrics/stream", "logs", "logs/stream", "checkpoints"):
        assert http.get(f"/v1/jobs/{job_id}/{path}", headers=other).status_code == 404, path


def read_stream(http: TestClient, job_id: str, headers: dict[str, str], stop_after: int) -> list[Any]:
    events = []
    with http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in parse(response.iter_lines()):
            events.append(event)
            if len(events) >= stop_after or event.event == "end":
                break
    return events


def finish(database_url: str, job_id: str) -> None:
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute("UPDATE jobs SET status = 'succeeded' WHERE id = %s", (job_id,))
        conn.execute("SELECT pg_notify('tm_jobs', %s)", (json.dumps({"job_id": job_id}),))


def test_stream_resumes_with_last_event_id_without_gap_or_duplicate(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    job_id = new_job(http, auth)
    for batch in range(3):
        assert post(http, job_id, auth, {"points": points(batch * 10, 10)}).status_code == 201
    first = read_stream(http, job_id, auth, stop_after=1)
    assert first[0].event == "metrics"
    seen = [item["seq"] for item in first[0].data["items"]]
    assert len(seen) == 60

    for batch in range(3, 5):
        post(http, job_id, auth, {"points": points(batch * 10, 10)})
    finish(database_url, job_id)
    rest = []
    with http.stream(
        "GET", f"/v1/jobs/{job_id}/metrics/stream", headers={**auth, "Last-Event-ID": first[0].id}
    ) as response:
        for event in parse(response.iter_lines()):
            rest.append(event)
            if event.event == "end":
                break
    resumed = [item["seq"] for e in rest if e.event == "metrics" for item in e.data["items"]]
    assert len(resumed) == 40
    assert not set(resumed) & set(seen)
    assert min(resumed) > max(seen)
    assert [e.event for e in rest][-2:] == ["status", "end"]
    assert rest[-2].data == {"status": "succeeded"}


def test_stream_delivers_points_as_they_arrive(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job_id = new_job(http, auth)
    received: list[int] = []
    with http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream", headers=auth) as response:
        events = parse(response.iter_lines())
        assert next(events).data == {"status": "queued"}
        for step in range(3):  # each point is sent only after the previous one was received
            post(http, job_id, auth, {"points": points(step, 1)})
            event = next(events)
            assert event.event == "metrics"
            received += [item["step"] for item in event.data["items"] if item["name"] == "loss"]
    assert received == [0, 1, 2]


def test_stream_cap_per_token_is_429(settings: Settings, auth: dict[str, str]) -> None:
    capped = settings.model_copy(update={"max_streams_per_token": 1})
    with TestClient(create_app(capped)) as http:
        job_id = new_job(http, auth)
        with http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream", headers=auth) as first:
            next(parse(first.iter_lines()))
            second = http.get(f"/v1/jobs/{job_id}/logs/stream", headers=auth)
            assert second.status_code == 429 and second.json()["error"] == "TooManyStreams"
        third = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth)
        assert third.status_code == 200


def test_checkpoints_recorded_by_the_job_are_listed(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    job_id = new_job(http, auth)
    token = bearer(job_token(database_url, job_id))
    for step in (0, 1):
        body = {"path": f"/storage/{job_id}/checkpoint_{step}", "step": step, "metrics": {"loss": 1.0 - step / 2}}
        response = http.post(f"/v1/jobs/{job_id}/checkpoints", params={"attempt": 1}, json=body, headers=token)
        assert response.status_code == 204
    items = http.get(f"/v1/jobs/{job_id}/checkpoints", headers=auth).json()["items"]
    assert [(i["step"], i["attempt"], i["metrics"]["loss"]) for i in items] == [(0, 1, 1.0), (1, 1, 0.5)]


def test_awkward_metric_names_survive_copy(http: TestClient, auth: dict[str, str]) -> None:
    job_id = new_job(http, auth)
    names = ["tab\there", "new\nline", "back\\slash", "ünïcode/λ", "quote'\"", "\\N"]
    body = {"points": [{"step": 1, "values": {name: float(i) for i, name in enumerate(names)}}]}
    assert post(http, job_id, auth, body).status_code == 201
    items = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth).json()["items"]
    assert {i["name"]: i["value"] for i in items} == {name: float(i) for i, name in enumerate(names)}


def test_sdk_reads_every_page_of_metrics(sdk, http: TestClient, auth: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    job_id = new_job(http, auth)
    assert post(http, job_id, auth, {"points": points(0, 25)}).status_code == 201
    values = list(sdk.iter_metrics(job_id, page_size=7))  # pages of 7 over 50 values
    assert len(values) == 50 and len({v.seq for v in values}) == 50


def test_a_read_is_the_metric_lists_own_json_and_the_stream_carries_the_same_points(
    http: TestClient, auth: dict[str, str]
) -> None:
    """The read is encoded once from plain values, not through MetricList: its bytes are still what
    MetricList writes for the same points (keys, order, times ending in Z, NaN as null), raw and
    downsampled, and the stream's events hold the same points."""
    from trainmaster.models import MetricList

    job_id = new_job(http, auth)
    raw = (
        '{"points": [{"step": 1, "values": {"loss": NaN, "grad_norm": 2.5e-07}, "ts": "2026-12-01T10:00:00Z"},'
        ' {"step": 2, "values": {"loss": 0.25, "acc": 1e16}, "rank": 1, "ts": "2026-12-01T10:00:01.5+01:00"}]}'
    )
    assert http.post(f"/v1/jobs/{job_id}/metrics", content=raw, headers={**auth, "Content-Type": "application/json"})
    for params in ({}, {"max_points": 10}, {"name": "loss"}):
        response = http.get(f"/v1/jobs/{job_id}/metrics", params=params, headers=auth)
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert response.content == MetricList.model_validate_json(response.content).model_dump_json().encode()
    items = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth).json()["items"]
    assert [(i["name"], i["value"], i["ts"]) for i in items] == [
        ("loss", None, "2026-12-01T10:00:00Z"),
        ("grad_norm", 2.5e-07, "2026-12-01T10:00:00Z"),
        ("loss", 0.25, "2026-12-01T09:00:01.500000Z"),
        ("acc", 1e16, "2026-12-01T09:00:01.500000Z"),
    ]
    [event] = read_stream(http, job_id, auth, stop_after=1)
    assert event.event == "metrics" and event.data["items"] == items


def test_bad_batches_are_refused_naming_the_field_and_store_nothing(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    """The fast lane (api/jobs/fast.py) answers ingest; its refusals are FastAPI's, field path included."""
    job_id = new_job(http, auth)
    json_headers = {**auth, "Content-Type": "application/json"}
    cases: list[tuple[bytes, str]] = [
        (b'{"points": [{"step": -1, "values": {"loss": 1}}]}', '["body", "points", 0, "step"]'),
        (b'{"points": [{"values": {"loss": 1}, "rank": 2147483648}]}', '["body", "points", 0, "rank"]'),
        (b'{"points": [{"values": {"loss": 1}}], "extra": 1}', '["body", "extra"]'),
        (b'{"points": [{"values": {"a\\u0000b": 1}}]}', '["body", "points", 0, "values"]'),
        (b'{"points": [', '["body"'),
    ]
    for raw, loc in cases:
        response = http.post(f"/v1/jobs/{job_id}/metrics", content=raw, headers=json_headers)
        assert response.status_code == 422, (raw, response.text)
        assert response.json()["error"] == "ValidationError" and loc in json.dumps(response.json()["detail"]), raw
    plain = http.post(
        f"/v1/jobs/{job_id}/metrics", content=b'{"points": []}', headers={**auth, "Content-Type": "text/plain"}
    )
    assert plain.status_code == 415
    limit = Settings().max_body_bytes
    oversize = b'{"points": [{"values": {"' + b"x" * limit + b'": 1}}]}'
    assert http.post(f"/v1/jobs/{job_id}/metrics", content=oversize, headers=json_headers).status_code == 413
    no_token = http.post(
        f"/v1/jobs/{job_id}/metrics", content=b'{"points": []}', headers={"Content-Type": "application/json"}
    )
    assert no_token.status_code == 401
    assert stored_rows(database_url, job_id) == 0
    lax = b'{"points": [{"step": "3", "values": {"loss": 1}, "ts": "2026-12-01T10:00Z"}]}'  # pydantic's reading
    assert http.post(f"/v1/jobs/{job_id}/metrics", content=lax, headers=json_headers).json()["stored"] == 1
    items = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth).json()["items"]
    assert [(i["step"], i["ts"][:19]) for i in items] == [(3, "2026-12-01T10:00:00")]


def test_a_refused_batch_names_every_bad_point(http: TestClient, auth: dict[str, str], database_url: str) -> None:
    """So that a sender can drop exactly those and send the rest (trainmaster.metrics)."""
    job_id = new_job(http, auth)
    good = {"step": 1, "values": {"loss": 1.0}}
    schema = [good, {"step": -1, "values": {"loss": 1.0}}, good, {"values": {"": 1.0}}, {"values": {"x": "y"}}]
    nul = [good, {"values": {"a\x00": 1.0}}, good, {"values": {"ok": 1.0, "b\x00c": 2.0}}]
    for bad_points, indices in ((schema, {1, 3, 4}), (nul, {1, 3})):
        response = post(http, job_id, auth, {"points": bad_points})
        assert response.status_code == 422
        locs = [error["loc"] for error in response.json()["detail"]]
        assert all(loc[:2] == ["body", "points"] for loc in locs), locs
        assert {loc[2] for loc in locs} == indices
    assert stored_rows(database_url, job_id) == 0


def test_the_sender_keeps_the_good_points_of_a_batch_with_bad_ones_and_tells_the_owner(
    http: TestClient, auth: dict[str, str], database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = new_job(http, auth)
    api = JobApi("http://testserver", job_token(database_url, job_id), job_id, 1, transport=http._transport)
    sender = MetricsSender(api, 0)
    for step in range(10):
        sender.log({"loss": float(step)}, step)
    sender.log({"loss": 1.0}, -1)  # a step below 0
    sender.log({"": 1.0}, 10)  # an empty name
    sender.log({"a\x00b": 1.0}, 11)  # a NUL in a name: refused only once the rest of its batch is valid
    for step in range(12, 20):
        sender.log({"loss": float(step)}, step)
    assert sender.flush(15)
    sender.close()
    api.close()

    items = http.get(f"/v1/jobs/{job_id}/metrics", headers=auth).json()["items"]
    assert [(i["name"], i["step"]) for i in items] == [("loss", s) for s in [*range(10), *range(12, 20)]]
    assert sender.rejected == 3 and sender.dropped == 0
    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth).json()["items"]
    drops = [event for event in events if event["kind"] == "metrics_dropped"]
    assert drops and drops[-1]["data"]["rejected"] == 3 and drops[-1]["data"]["rank"] == 0
    assert "3 refused by the API" in drops[-1]["message"]
    assert "3 refused by the API" in capsys.readouterr().err  # and in the job's log
