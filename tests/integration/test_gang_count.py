"""What an elastic gang is counted at is bounded by its admitted {min, max} and by what Ray shows: a job
that reports fewer workers than its placement group holds (to be charged less) is counted at Ray's
size after the next reconcile round, with a `gang_counted` event; Ray showing fewer, or more than the
gang's max, never lowers the count nor lifts it past max. A report outside {min, max} is refused (422)
and not counted. Through the real app, real dispatcher rounds against the exact fake Ray
(tests/factories/ray.py) and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from api.dispatcher.backend import RayJobState
from tests.factories.http import bearer
from tests.factories.world import World, run
from trainmaster.models import JobStatus

ELASTIC: dict[str, Any] = {"scaling": {"num_workers": {"min": 2, "max": 4}, "resources_per_worker": {"CPU": 1}}}


def report(http: TestClient, token: str, job_id: uuid.UUID, to: object) -> int:
    body = {"kind": "resized", "message": f"-> {to} workers", "data": {"to": to}}
    return http.post(f"/v1/jobs/{job_id}/events", json=body, headers=bearer(token)).status_code


def test_an_elastic_gang_is_counted_at_no_fewer_workers_than_ray_shows(http: TestClient, database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus = 8
            job_id = await world.submit(**ELASTIC)
            sub = f"tm-{job_id}-1"
            await world.dispatcher().admit_round()
            world.ray.jobs[sub] = RayJobState.RUNNING
            await world.dispatcher().reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.running
            claim = {"job_id": str(job_id), "claim": world.ray.launches[sub].metadata["trainmaster_claim"]}
            token = http.post("/v1/tokens/claim", json=claim).json()["token"]  # as its driver does

            async def cpus() -> float:
                return (await world.job(job_id)).gang_cpus

            assert await cpus() == 2  # admitted at its minimum
            assert report(http, token, job_id, 4) == 201
            assert await cpus() == 4
            assert report(http, token, job_id, 9) == 422  # outside {2, 4}: refused, not counted
            assert await cpus() == 4

            assert report(http, token, job_id, 2) == 201  # it says 2 ...
            assert await cpus() == 2
            world.ray.bundles[sub] = 4  # ... while its placement group holds 4 workers
            await world.dispatcher().reconcile_round()
            assert await cpus() == 4
            [counted] = [e for e in await world.events(job_id) if e.kind == "gang_counted"]
            assert counted.data == {"from": 2, "to": 4} and "placement group" in (counted.message or "")

            world.ray.bundles[sub] = 3  # a group being replaced shows fewer for a moment: the count stays
            await world.dispatcher().reconcile_round()
            assert await cpus() == 4
            assert report(http, token, job_id, 3) == 201
            world.ray.bundles[sub] = 64  # never past the gang's max
            await world.dispatcher().reconcile_round()
            assert await cpus() == 4
            assert len([e for e in await world.events(job_id) if e.kind == "gang_counted"]) == 2

    run(scenario())
