"""What one request makes the shared API process hold, through the real app on a real PostgreSQL:
a page of logs, of a job's events or checkpoints, or of jobs holds at most TRAINMASTER_PAGE_MAX_BYTES whatever `limit`
asks, and says where the next page starts, so the SDK still reads every row; code uploads are read a bounded number at a
time, one project's past its share refused with 429 naming the setting while another project's goes
through."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
import zipfile
from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.code_packages.gate import UploadGate
from api.errors import LimitExceeded
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import job_token, project_token
from tests.factories.http import bearer
from tests.factories.jobs import spec
from trainmaster import Client

LINE = "x" * 8000  # about as long as the dispatcher keeps a line (log_line_max_bytes)
PAGE_MAX = 256 * 1024


@pytest.fixture
def database_url(fresh_database_url: str) -> str:
    return fresh_database_url


@pytest.fixture
def http(database_url: str) -> Iterator[TestClient]:
    settings = Settings(database_url=database_url, code_retention_days=None, page_max_bytes=PAGE_MAX)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def stored_lines(database_url: str, job_id: str, count: int) -> None:
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(
            "INSERT INTO log_lines (job_id, attempt, source, line)"
            " SELECT %s, 1, 'driver', %s || n FROM generate_series(1, %s) n",
            (job_id, LINE, count),
        )


def test_a_log_page_holds_at_most_page_max_bytes_and_the_sdk_still_reads_every_line(
    http: TestClient, database_url: str
) -> None:
    token = project_token(database_url, "alpha")
    auth = bearer(token)
    job_id = http.post("/v1/jobs", json=spec(), headers=auth).json()["id"]
    stored_lines(database_url, job_id, 300)  # 2.4 MB in all

    page = http.get(f"/v1/jobs/{job_id}/logs", params={"limit": 100_000}, headers=auth)
    assert page.status_code == 200, page.text
    items = page.json()["items"]
    assert 0 < sum(len(item["line"]) for item in items) <= PAGE_MAX  # not the 300 lines asked for
    assert page.json()["next_after_seq"] == items[-1]["seq"]
    tail = http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 100_000}, headers=auth).json()
    assert sum(len(item["line"]) for item in tail["items"]) <= PAGE_MAX and tail["items"][-1]["line"] == f"{LINE}300"

    with Client("http://testserver", token, transport=http._transport) as sdk:
        lines = [line.line for line in sdk.logs(job_id)]
    assert lines == [f"{LINE}{n}" for n in range(1, 301)]  # every line once, in order, across pages
    last = http.get(f"/v1/jobs/{job_id}/logs", params={"after_seq": items[0]["seq"] + 299}, headers=auth).json()
    assert last == {"items": [], "next_after_seq": None}


def project_id(database_url: str, name: str) -> uuid.UUID:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT id FROM projects WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def package() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", f"print('{uuid.uuid4()}')\n")
    return buffer.getvalue()


def test_an_upload_past_its_projects_share_is_429_naming_the_setting_and_another_project_uploads(
    http: TestClient, database_url: str
) -> None:
    alpha = {**bearer(project_token(database_url, "alpha")), "Content-Type": "application/zip"}
    beta = {**bearer(project_token(database_url, "beta")), "Content-Type": "application/zip"}
    assert http.post("/v1/code", content=package(), headers=alpha).status_code == 201  # a slot taken, then freed
    gate: UploadGate = http.app.state.upload_gate  # type: ignore[attr-defined]
    gate.wait_s = 0.2
    gate.held[project_id(database_url, "alpha")] = 1  # an upload of alpha's is being read

    refused = http.post("/v1/code", content=package(), headers=alpha)
    assert refused.status_code == 429, refused.text
    assert "TRAINMASTER_CODE_UPLOADS_IN_FLIGHT_PER_PROJECT" in refused.json()["detail"]
    assert refused.headers["Retry-After"] == "1"
    assert http.post("/v1/code", content=package(), headers=beta).status_code == 201
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM code_packages").fetchone()
    assert row is not None and row[0] == 2  # the refused one stored nothing


def test_the_gate_lets_in_flight_uploads_through_in_turn_and_refuses_past_the_wait() -> None:
    async def scenario() -> None:
        gate = UploadGate(in_flight=2, per_project=1, wait_s=5)
        a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        order: list[str] = []
        release = asyncio.Event()

        async def upload(project: uuid.UUID, name: str) -> None:
            async with gate.slot(project):
                order.append(name)
                await release.wait()

        first = [asyncio.create_task(upload(a, "a1")), asyncio.create_task(upload(b, "b1"))]
        waiting = asyncio.create_task(upload(c, "c1"))  # the process's 2 are taken: it waits its turn

        async def both_in() -> None:
            while len(order) < 2:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(both_in(), 5)  # polled, with a deadline
        assert sorted(order) == ["a1", "b1"] and not waiting.done()
        gate.wait_s = 0.05
        with pytest.raises(LimitExceeded, match="TRAINMASTER_CODE_UPLOADS_IN_FLIGHT_PER_PROJECT"):
            async with gate.slot(a):
                pass
        release.set()
        await asyncio.wait_for(asyncio.gather(*first, waiting), 5)
        assert order[-1] == "c1" and not gate.held

    asyncio.run(scenario())


def test_event_and_job_pages_hold_at_most_page_max_bytes_and_the_sdk_reads_them_all(
    http: TestClient, database_url: str
) -> None:
    token = project_token(database_url, "alpha")
    auth = bearer(token)
    big = {"blob": "y" * 15_000}  # an event's data may hold 16 KiB
    jobs = [http.post("/v1/jobs", json=spec(config={"blob": "z" * 60_000, "n": n}), headers=auth) for n in range(12)]
    assert all(job.status_code == 201 for job in jobs), jobs[0].text
    job_id = jobs[0].json()["id"]
    with psycopg.connect(libpq(database_url)) as conn:
        conn.execute(
            "INSERT INTO job_events (job_id, kind, message, data)"
            " SELECT %s, 'note', 'note ' || n, jsonb_build_object('n', n, 'blob', %s::text)"
            " FROM generate_series(1, 60) n",
            (job_id, big["blob"]),
        )

        conn.execute(
            "INSERT INTO checkpoints (job_id, path, step, metrics)"
            " SELECT %s, '/ckpt/' || n, n, jsonb_build_object('blob', %s::text) FROM generate_series(1, 60) n",
            (job_id, big["blob"]),
        )

    for listed in ("events", "checkpoints"):
        page = http.get(f"/v1/jobs/{job_id}/{listed}", headers=auth).json()
        held = sum(len(json.dumps(row.get("data") or row.get("metrics"))) for row in page["items"])
        assert 0 < held <= PAGE_MAX and page["next_after_id"] == page["items"][-1]["id"], listed  # not 900 KB
    events = http.get(f"/v1/jobs/{job_id}/events", headers=auth).json()
    assert 0 < sum(len(json.dumps(e["data"])) for e in events["items"]) <= PAGE_MAX  # not all 60 (900 KB)
    assert events["next_after_id"] == events["items"][-1]["id"]
    page = http.get("/v1/jobs", params={"limit": 500}, headers=auth).json()
    assert 0 < len(page["items"]) < 12 and page["next_cursor"]  # 12 specs of 60 KB: 720 KB, past the page

    with Client("http://testserver", token, transport=http._transport) as sdk:
        notes = [e.data["n"] for e in sdk.events(job_id) if e.kind == "note"]
        listed = list(sdk.list(limit=500))
        steps = [checkpoint.step for checkpoint in sdk.checkpoints(job_id)]
    assert steps == list(range(1, 61))
    assert notes == list(range(1, 61))  # every event once, in order
    assert sorted(job.id for job in listed) == sorted(job.json()["id"] for job in jobs)  # every job once


def test_what_a_job_attaches_to_an_event_or_a_checkpoint_is_at_most_16_kib(http: TestClient, database_url: str) -> None:
    job_id = http.post("/v1/jobs", json=spec(), headers=bearer_of(database_url)).json()["id"]
    auth = bearer(job_token(database_url, job_id))
    large = {"blob": "w" * 17_000}
    for path, body, field in (
        ("events", {"kind": "note", "data": large}, "data"),
        ("checkpoints", {"path": "/ckpt/1", "metrics": large}, "metrics"),
    ):
        refused = http.post(f"/v1/jobs/{job_id}/{path}", json=body, headers=auth)
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"][-1] == field, refused.json()
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == 0


def bearer_of(database_url: str) -> dict[str, str]:
    return bearer(project_token(database_url, "alpha"))
