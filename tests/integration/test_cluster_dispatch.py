"""Dispatch per cluster, on a real PostgreSQL with each Ray cluster an exact fake: each cluster's jobs
are admitted against that cluster's resources and launched on it alone, and one dispatcher process
serves every cluster of the `clusters` table, a slow or unreachable one delaying only its own jobs.
Two real heads run in tests/security/test_hostile_tenant.py: the session's dispatcher finds a cluster
added to the table (`east`, a second head with its own token) and runs its project's job there."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.clusters import service as clusters
from api.db.models import ClusterRow, Project
from api.dispatcher import main as dispatcher_main
from api.dispatcher.placement import ClusterCapacity
from tests.factories.auth import scoped_token
from tests.factories.http import bearer
from tests.factories.ray import FakeRay
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus


async def add_cluster(world: World, name: str, project: str) -> uuid.UUID:
    """The cluster `name` and `project` bound to it."""
    await world.submit(project, **one_worker())  # creates the project (on `default`) with a job there
    async with world.sessions() as session, session.begin():
        row = ClusterRow(id=uuid.uuid4(), name=name, address=f"http://{name}:8265")
        session.add(row)
        await session.flush()
        await session.execute(update(Project).where(Project.name == project).values(cluster_id=row.id))
        return row.id


async def default_id(world: World) -> uuid.UUID:
    async with world.sessions() as session:
        return (await session.execute(select(ClusterRow.id).where(ClusterRow.name == "default"))).scalar_one()


def test_each_cluster_admits_its_own_jobs_against_its_own_resources(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            east = await add_cluster(world, "east", "tenant-b")
            home = await default_id(world)
            world.ray.cpus = 1  # the default cluster holds one 1-CPU job
            on_home = [await world.submit("tenant-a", **one_worker()) for _ in range(2)]
            east_ray = FakeRay(cpus=4)
            on_east = [await world.submit("tenant-b", **one_worker()) for _ in range(2)]

            def dispatcher(cluster: uuid.UUID, ray: FakeRay) -> Any:
                d = world.dispatcher()
                d.ray, d.cluster_id, d.cluster_name = ray, cluster, "east" if cluster == east else "default"
                return d

            assert await dispatcher(home, world.ray).admit_round() == 1
            # The default cluster's round never touched tenant-b's jobs (its project is on east) ...
            for job_id in on_east:
                assert (await world.job(job_id)).status is JobStatus.queued
            # ... and east admits all three of its jobs (the one made before the move too) on its own Ray,
            # although the default cluster is full.
            assert await dispatcher(east, east_ray).admit_round() == 3
            assert {(await world.job(j)).status for j in on_east} == {JobStatus.starting}
            assert all(sub.startswith("tm-") for sub in east_ray.launches)
            assert not set(east_ray.launches) & set(world.ray.launches)
            home_states = [(await world.job(j)).status for j in on_home]
            assert sorted(home_states) == [JobStatus.queued, JobStatus.starting]

            # An unreachable east gives its own waiting jobs that reason, and no one else's.
            later = await world.submit("tenant-b", **one_worker())
            east_ray.down = True
            await dispatcher(east, east_ray).admit_round()
            assert "cluster 'east' is unreachable" in ((await world.job(later)).pending_reason or "")
            [waiting] = [j for j in on_home if (await world.job(j)).status is JobStatus.queued]
            assert "unreachable" not in ((await world.job(waiting)).pending_reason or "")

            # Reconcile follows each cluster's jobs only: east's leases are east's dispatcher's.
            await dispatcher(home, world.ray).reconcile_round()
            for job_id in on_east:
                assert (await world.job(job_id)).lease_owner == "d1"  # set by east's admission, untouched
            assert all(sub not in world.ray.log_reads for sub in east_ray.launches)

    run(scenario())


class SlowRay(FakeRay):
    """A cluster whose head takes `delay_s` to answer anything (a blocking call, as Ray's client is)."""

    delay_s: float = 8.0

    def cluster(self) -> ClusterCapacity:
        time.sleep(self.delay_s)
        return super().cluster()


def test_one_dispatcher_serves_every_cluster_and_a_slow_one_delays_only_its_own(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with World(database_url, poll_interval_s=0.2) as world:
            await add_cluster(world, "slow", "tenant-slow")
            await add_cluster(world, "fast", "tenant-fast")
            rays = {"slow": SlowRay(cpus=8), "fast": FakeRay(cpus=8)}
            made: list[str] = []

            def backend_for(row: ClusterRow, default_address: str, timeout_s: float = 10.0, **_: Any) -> Any:
                made.append(row.name)
                return rays[row.name]

            monkeypatch.setattr(clusters, "backend_for", backend_for)
            server = asyncio.create_task(dispatcher_main.run(world.settings, backend=world.ray))
            try:
                fast_job = await world.submit("tenant-fast", **one_worker())
                slow_job = await world.submit("tenant-slow", **one_worker())
                deadline = time.monotonic() + 6  # well inside the slow head's first answer
                while (await world.job(fast_job)).status is JobStatus.queued and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert (await world.job(fast_job)).status is JobStatus.starting
                assert (await world.job(slow_job)).status is JobStatus.queued
                assert sorted(made) == ["fast", "slow"]  # `default` runs on the given backend
                deadline = time.monotonic() + 30
                while (await world.job(slow_job)).status is JobStatus.queued and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert (await world.job(slow_job)).status is JobStatus.starting
                assert any(sub.startswith(f"tm-{slow_job}") for sub in rays["slow"].launches)
                assert not any(sub.startswith(f"tm-{slow_job}") for sub in rays["fast"].launches)
            finally:
                server.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await server

    run(scenario())


def test_queue_positions_count_only_the_jobs_of_the_same_cluster(
    http: TestClient, auth: dict[str, str], other_token: str, database_url: str
) -> None:
    """Each cluster admits its own queue, so a job's `queue_position` (at submission, read alone, in a
    list, in GET /v1/queues) counts only jobs of projects on its cluster."""
    beta = bearer(other_token)
    root = bearer(scoped_token(database_url))
    assert (
        http.post("/v1/clusters", json={"name": "east", "address": "http://east:8265"}, headers=root).status_code == 201
    )
    assert http.patch("/v1/projects/beta", json={"cluster": "east"}, headers=root).status_code == 200
    body = {"name": "j", "entrypoint": "builtin:mlp"}
    alpha_jobs = [http.post("/v1/jobs", json=body, headers=auth).json() for _ in range(3)]
    assert [job["queue_position"] for job in alpha_jobs] == [1, 2, 3]
    submitted = http.post("/v1/jobs", json=body, headers=beta).json()
    assert (submitted["cluster"], submitted["queue_position"]) == ("east", 1)  # not behind alpha's three
    assert http.get(f"/v1/jobs/{submitted['id']}", headers=beta).json()["queue_position"] == 1
    assert [job["queue_position"] for job in http.get("/v1/jobs", headers=beta).json()["items"]] == [1]
    assert http.get(f"/v1/jobs/{alpha_jobs[2]['id']}", headers=auth).json()["queue_position"] == 3
    east = http.get("/v1/queues", params={"cluster": "east"}, headers=root).json()
    assert [(p["project"], [j["queue_position"] for j in p["jobs"]]) for p in east["items"]] == [("beta", [1])]
