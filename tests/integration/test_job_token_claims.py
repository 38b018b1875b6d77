"""A launch carries its job token's single-use claim, never the token (every job on a Ray cluster can
read every launch's environment through Ray's Jobs API). Through the real app and PostgreSQL: a claim
authenticates nothing; exchanged once it gives the token; presented again it is refused and changes
nothing (the job keeps its token); another job's id, an old claim or a bad body are refused and change
nothing."""

from __future__ import annotations

import psycopg
from fastapi.testclient import TestClient

from api.auth.service import hash_token
from api.settings import libpq_url
from tests.factories.auth import job_claim
from tests.factories.http import bearer
from tests.factories.jobs import spec

EVENT = {"kind": "runtime", "message": "m", "data": {"backend": "gloo"}}


def new_job(http: TestClient, auth: dict[str, str]) -> str:
    response = http.post("/v1/jobs", json=spec(), headers=auth)
    assert response.status_code == 201
    return str(response.json()["id"])


def claim(http: TestClient, job_id: str, secret: str) -> tuple[int, str]:
    response = http.post("/v1/tokens/claim", json={"job_id": job_id, "claim": secret})
    body = response.json()
    return response.status_code, body.get("token") or str(body.get("detail", ""))


def test_a_claim_works_once_and_a_replay_takes_nothing_away(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    job_id = new_job(http, auth)
    secret = job_claim(database_url, job_id)
    # The claim itself, as read from a launch, opens nothing.
    assert http.post(f"/v1/jobs/{job_id}/events", json=EVENT, headers=bearer(secret)).status_code == 401

    status, token = claim(http, job_id, secret)
    assert status == 201 and token.startswith("tm_") and token != secret
    assert http.post(f"/v1/jobs/{job_id}/events", json=EVENT, headers=bearer(token)).status_code == 201
    assert http.post(f"/v1/jobs/{job_id}/events", json=EVENT, headers=bearer(secret)).status_code == 401

    status, error = claim(http, job_id, secret)  # seen later: a thief's, or a replay
    assert status == 401 and "used already" in error
    assert http.post(f"/v1/jobs/{job_id}/events", json=EVENT, headers=bearer(token)).status_code == 201


def test_another_jobs_id_an_old_claim_and_a_bad_body_are_refused_and_change_nothing(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    mine, other = new_job(http, auth), new_job(http, auth)
    secret = job_claim(database_url, mine)
    assert claim(http, other, secret)[0] == 401
    assert claim(http, "not-a-job-id-but-36-characters-long!", secret)[0] in (401, 404)
    for body in ({"job_id": mine}, {"claim": secret}, {"job_id": mine, "claim": secret, "extra": 1}):
        response = http.post("/v1/tokens/claim", json=body)
        assert response.status_code == 422, body
    status, token = claim(http, mine, secret)  # none of that used it up
    assert status == 201 and http.post(f"/v1/jobs/{mine}/events", json=EVENT, headers=bearer(token)).status_code == 201

    old = job_claim(database_url, mine)
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(
            "UPDATE api_tokens SET created_at = now() - interval '2 hours' WHERE token_hash = %s", (hash_token(old),)
        )
    status, error = claim(http, mine, old)  # past launch_timeout_s + starting_timeout_s
    assert status == 401 and "expired" in error
