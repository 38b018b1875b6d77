"""An elastic gang's resizes move what it holds, on a real PostgreSQL through the real API: its
controller's `resized` event (job token) sets the job's gang to the new size, and its project's usage
(quotas, admission's book, fair share, /v1/projects) follows; a size outside the gang's {min, max}, or
not a whole number, is refused (422 naming `to`) and neither counted nor recorded; a fixed gang's, or a
finished job's, report changes nothing."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi.testclient import TestClient

import trainmaster as tm
from api.settings import libpq_url as libpq
from tests.factories.auth import job_token, scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import spec


def resize(http: TestClient, database_url: str, job_id: str, to: Any, *, refused: bool = False) -> None:
    body = {"kind": "resized", "message": f"? -> {to} workers", "data": {"to": to}}
    answer = http.post(f"/v1/jobs/{job_id}/events", json=body, headers=bearer(job_token(database_url, job_id)))
    if refused:
        assert answer.status_code == 422, answer.text
        [problem] = answer.json()["detail"]
        assert problem["loc"] == ["body", "data", "to"] and "from 2 to 4" in problem["msg"], problem
    else:
        assert answer.status_code in (200, 201), answer.text


def set_status(database_url: str, job_id: str, status: str) -> None:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute("UPDATE jobs SET status = %s WHERE id = %s", (status, job_id))


def holds(http: TestClient, database_url: str) -> dict[str, float]:
    admin = bearer(scoped_token(database_url, "default", "admin"))
    return http.get("/v1/projects/alpha", headers=admin).json()["usage"]


def test_what_an_elastic_gang_holds_follows_its_resizes_and_a_size_out_of_range_is_refused(
    http: TestClient, sdk: tm.Client, database_url: str
) -> None:
    per_worker = {"num_workers": {"min": 2, "max": 4}, "resources_per_worker": {"CPU": 2, "GPU": 1}}
    job = sdk.submit(tm.JobSpec.model_validate(spec(scaling=per_worker)))
    fixed = sdk.submit(tm.JobSpec.model_validate(spec(name="fixed", scaling={"num_workers": 1})))
    set_status(database_url, job.id, "running")
    set_status(database_url, fixed.id, "running")
    assert holds(http, database_url) == {"CPU": 4 + 1, "GPU": 2}  # admitted and held at its minimum

    resize(http, database_url, job.id, 3)
    assert holds(http, database_url) == {"CPU": 6 + 1, "GPU": 3}
    resize(http, database_url, job.id, 2)
    assert holds(http, database_url) == {"CPU": 4 + 1, "GPU": 2}
    resize(http, database_url, job.id, 4)
    assert holds(http, database_url) == {"CPU": 8 + 1, "GPU": 4}
    for outside in (1, 0, -3, 5, 64, "3", True, None, 2.5):  # a job that would pay for less, or more
        resize(http, database_url, job.id, outside, refused=True)
    assert holds(http, database_url) == {"CPU": 8 + 1, "GPU": 4}  # still what it last reported within range
    resize(http, database_url, fixed.id, 8)  # a fixed gang does not resize
    assert holds(http, database_url) == {"CPU": 8 + 1, "GPU": 4}
    assert [e.data["to"] for e in sdk.events(job.id) if e.kind == "resized"] == [3, 2, 4]  # no refused one

    set_status(database_url, job.id, "succeeded")
    resize(http, database_url, job.id, 4)  # a late report of a finished job
    assert holds(http, database_url) == {"CPU": 1, "GPU": 0}
