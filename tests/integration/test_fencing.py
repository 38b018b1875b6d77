"""Fencing on a real PostgreSQL through the real app: a job token is tied to its attempt, and once
that attempt is superseded (a retry after Ray lost it) or has ended, every write with it is refused
(409), changes nothing, and is counted in the job's `fenced` event. Attempts come from real dispatcher
rounds against the exact fake Ray (tests/factories/ray.py)."""

from __future__ import annotations

import uuid

import psycopg
from fastapi.testclient import TestClient

from api.dispatcher.backend import RayJobState
from api.settings import libpq_url as libpq
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run


def claimed(http: TestClient, world: World, job_id: uuid.UUID, n: int) -> dict[str, str]:
    """The job token of attempt `n`, exchanged for the claim its launch carried, as its driver does."""
    claim = world.ray.launches[f"tm-{job_id}-{n}"].metadata["trainmaster_claim"]
    response = http.post("/v1/tokens/claim", json={"job_id": str(job_id), "claim": claim})
    assert response.status_code == 201, response.text
    return bearer(response.json()["token"])


def points(database_url: str, job_id: uuid.UUID) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM metric_points WHERE job_id = %s", (job_id,)).fetchone()
        assert row is not None
        return int(row[0])


def test_a_superseded_attempts_writes_are_refused_and_counted(http: TestClient, database_url: str) -> None:
    batch = {"points": [{"step": 1, "values": {"loss": 0.5}}]}

    async def first_attempt(world: World) -> uuid.UUID:
        job_id = await world.submit(max_retries=1, **one_worker())
        await world.dispatcher().admit_round()
        world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
        await world.dispatcher().reconcile_round()
        return job_id

    async def second_attempt(world: World) -> None:
        world.ray.restart()  # Ray forgets attempt 1: it is lost, and the retry is attempt 2
        await world.dispatcher().reconcile_round()
        await world.dispatcher().admit_round()

    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await first_attempt(world)
            old = claimed(http, world, job_id, 1)
            path = f"/v1/jobs/{job_id}"
            assert http.post(f"{path}/metrics", json=batch, headers=old).status_code == 201
            assert points(database_url, job_id) == 1

            await second_attempt(world)
            assert [(a.n, a.status) for a in await world.attempts(job_id)] == [(1, "lost"), (2, "submitted")]
            for _ in range(3):  # the ghost of attempt 1 goes on reporting
                refused = http.post(f"{path}/metrics", json=batch, headers=old)
                assert refused.status_code == 409, refused.text
                assert refused.json()["error"] == "AttemptSuperseded"
                assert "attempt 1 of job" in refused.json()["detail"] and "superseded by attempt 2" in refused.text
            checkpoint = {"path": "/ghost/ckpt", "step": 9, "metrics": {}}
            assert http.post(f"{path}/checkpoints", json=checkpoint, headers=old).status_code == 409
            assert points(database_url, job_id) == 1  # nothing of the ghost's was stored
            [fenced] = [e for e in await world.events(job_id) if e.kind == "fenced"]
            assert fenced.data == {"attempt": 1} and fenced.count == 4
            assert "attempt 1 refused: that attempt was superseded by attempt 2" in (fenced.message or "")

            # Attempt 2's own token writes; once attempt 2 ends, it is refused the same way.
            new = claimed(http, world, job_id, 2)
            second = {"points": [{"step": 2, "values": {"loss": 0.4}}]}
            assert http.post(f"{path}/metrics", json=second, headers=new).status_code == 201
            world.ray.jobs[f"tm-{job_id}-2"] = RayJobState.SUCCEEDED
            await world.dispatcher().reconcile_round()
            late = http.post(f"{path}/metrics", json=batch, headers=new)
            assert late.status_code == 409 and "ended (succeeded)" in late.json()["detail"], late.text
            assert points(database_url, job_id) == 2

    run(scenario())


def test_a_token_revoked_while_its_attempt_runs_stays_401(http: TestClient, database_url: str) -> None:
    """A token revoked (by its owner) while the attempt still runs: that caller is a stranger, not a
    ghost, and learns nothing about the attempt."""

    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            claim = world.ray.launches[f"tm-{job_id}-1"].metadata["trainmaster_claim"]
            body = {"job_id": str(job_id), "claim": claim}
            token = http.post("/v1/tokens/claim", json=body).json()["token"]
            with psycopg.connect(libpq(database_url), autocommit=True) as conn:
                conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE job_id = %s", (job_id,))
            batch = {"points": [{"step": 1, "values": {"loss": 0.5}}]}
            answer = http.post(f"/v1/jobs/{job_id}/metrics", json=batch, headers=bearer(token))
            assert answer.status_code == 401, answer.text
            assert not [e for e in await world.events(job_id) if e.kind == "fenced"]

    run(scenario())
