"""Case 1: one Idempotency-Key, serially and 10x at once, gives one job and identical answers."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.conftest import ApiProcess
from tests.factories.auth import project_token
from tests.factories.jobs import spec
from tests.reliability.conftest import bearer


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
