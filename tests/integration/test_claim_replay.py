"""A spent claim, replayed, is a plain 401 that changes nothing. Whoever can read a launch (any job of
its Ray cluster, through Ray's Jobs API) can replay its claim; if a replay revoked the token the claim
gave, one tenant could stop another's running jobs. Through the real app, a real dispatcher round
against the exact fake Ray (tests/factories/ray.py) and PostgreSQL."""

from __future__ import annotations

import uuid

import psycopg
from fastapi.testclient import TestClient

from api.dispatcher.backend import RayJobState
from api.settings import libpq_url as libpq
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run

BATCH = {"points": [{"step": 1, "values": {"loss": 0.5}}]}


def token_rows(database_url: str, job_id: uuid.UUID) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq(database_url)) as conn:
        query = "SELECT token_hash, claim_hash, claimed_at, revoked_at FROM api_tokens WHERE job_id = %s"
        return conn.execute(query, (job_id,)).fetchall()


def test_a_replayed_claim_is_refused_and_the_job_keeps_its_token_and_its_attempt(
    http: TestClient, database_url: str
) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await world.dispatcher().reconcile_round()
            body = {"job_id": str(job_id), "claim": world.ray.launches[f"tm-{job_id}-1"].metadata["trainmaster_claim"]}
            exchanged = http.post("/v1/tokens/claim", json=body)  # the driver's exchange
            assert exchanged.status_code == 201, exchanged.text
            auth = bearer(exchanged.json()["token"])
            before = token_rows(database_url, job_id)

            replay = http.post("/v1/tokens/claim", json=body)  # a neighbour that read the launch
            assert replay.status_code == 401, replay.text
            assert replay.json()["error"] == "Unauthorized" and "used already" in replay.json()["detail"]
            assert "token" not in replay.json()

            assert token_rows(database_url, job_id) == before  # nothing revoked, nothing written
            assert http.post(f"/v1/jobs/{job_id}/metrics", json=BATCH, headers=auth).status_code == 201
            await world.dispatcher().reconcile_round()
            assert [(a.n, a.status) for a in await world.attempts(job_id)] == [(1, "running")]
            assert (await world.job(job_id)).status == "running"
            assert f"tm-{job_id}-1" not in world.ray.stopped

    run(scenario())
