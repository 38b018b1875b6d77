"""Usage accounting on a real PostgreSQL: attempts driven by real dispatcher rounds (the exact fake Ray
of tests/factories/ray.py) end succeeded, failed after a checkpoint and cancelled; the trigger's split
of each attempt (starting, productive, lost) is checked against the rows' own timestamps, and
`GET /v1/usage` (JSON and CSV, per project, user and job) and each job's goodput against those."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.db.models import Checkpoint, Job, JobAttempt
from api.dispatcher.backend import RayJobState
from tests.factories.auth import scoped_token
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run, submit_as
from trainmaster.models import JobStatus


async def rewind(world: World, job_id: uuid.UUID, admitted_s: float, running_s: float) -> None:
    """Move the running attempt's admission and start back in time (from the database's clock)."""

    async def change(session: Any) -> None:
        now = (await session.execute(select(JobAttempt.created_at).where(JobAttempt.job_id == job_id))).scalar_one()
        await session.execute(
            update(JobAttempt)
            .where(JobAttempt.job_id == job_id)
            .values(created_at=now - timedelta(seconds=admitted_s), running_at=now - timedelta(seconds=running_s))
        )

    await world.execute(change)


def test_attempts_split_exactly_and_usage_adds_up(http: TestClient, token: str, database_url: str) -> None:
    async def scenario() -> dict[str, uuid.UUID]:
        async with World(database_url) as world:
            world.ray.cpus = 8
            ids = {
                "done": await submit_as(world, "alpha", "ana", **one_worker(cpus=2)),
                "broke": await submit_as(world, "alpha", "bob", **one_worker(cpus=1)),
                "stopped": await submit_as(world, "beta", "cy", **one_worker(cpus=1)),
            }
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            for job_id in ids.values():
                world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await dispatcher.reconcile_round()  # no API address: the driver running is the start
            assert {(await world.job(j)).status for j in ids.values()} == {JobStatus.running}
            for job_id in ids.values():
                await rewind(world, job_id, admitted_s=100, running_s=90)  # 10 s starting

            async def checkpoint(session: Any) -> None:  # "broke" saved 30 s into its run
                at = await session.execute(select(JobAttempt.running_at).where(JobAttempt.job_id == ids["broke"]))
                session.add(
                    Checkpoint(
                        job_id=ids["broke"],
                        attempt=1,
                        path="/c",
                        step=5,
                        created_at=at.scalar_one() + timedelta(seconds=30),
                    )
                )

            await world.execute(checkpoint)
            world.ray.jobs[f"tm-{ids['done']}-1"] = RayJobState.SUCCEEDED
            world.ray.jobs[f"tm-{ids['broke']}-1"] = RayJobState.FAILED
            await world.execute(
                lambda s: s.execute(update(Job).where(Job.id == ids["stopped"]).values(status="cancelling"))
            )
            await dispatcher.reconcile_round()  # stops the cancelled one in Ray
            await dispatcher.reconcile_round()
            assert (await world.job(ids["done"])).status is JobStatus.succeeded
            assert (await world.job(ids["broke"])).status is JobStatus.failed
            assert (await world.job(ids["stopped"])).status is JobStatus.cancelled
            return ids

    ids = run(scenario())

    attempts: dict[str, dict[str, Any]] = {}
    for name, job_id in ids.items():
        owner = "beta" if name == "stopped" else "alpha"
        job = http.get(f"/v1/jobs/{job_id}", headers=bearer(scoped_token(database_url, owner, "project")))
        assert job.status_code == 200, job.text
        [attempt] = job.json()["attempts"]
        attempts[name] = attempt | {"goodput": job.json()["goodput"]}

    def seconds(attempt: dict[str, Any], a: str, b: str) -> float:
        return (datetime.fromisoformat(attempt[b]) - datetime.fromisoformat(attempt[a])).total_seconds()

    for name, attempt in attempts.items():
        assert abs(attempt["starting_s"] - 10) < 1e-3, (name, attempt)
        held = seconds(attempt, "admitted_at", "finished_at")
        assert abs(attempt["starting_s"] + attempt["productive_s"] + attempt["lost_s"] - held) < 1e-3, (name, attempt)
        assert abs(attempt["goodput"] - attempt["productive_s"] / held) < 1e-6
    ran = {name: seconds(a, "running_at", "finished_at") for name, a in attempts.items()}
    assert attempts["done"]["lost_s"] == 0 and abs(attempts["done"]["productive_s"] - ran["done"]) < 1e-3
    assert abs(attempts["broke"]["lost_s"] - (ran["broke"] - 30)) < 1e-3  # all since its checkpoint
    assert abs(attempts["stopped"]["lost_s"] - ran["stopped"]) < 1e-3  # never checkpointed: all of it

    admin = bearer(scoped_token(database_url, "default", "admin"))
    by_project = {r["key"]: r for r in http.get("/v1/usage", headers=admin).json()["items"]}
    gang = {"done": 2, "broke": 1, "stopped": 1}

    def cpu_hours(*names: str, part: str) -> float:
        return sum(attempts[n][f"{part}_s"] * gang[n] for n in names) / 3600

    alpha = by_project["alpha"]
    assert alpha["attempts"] == 2
    for part in ("starting", "productive", "lost"):
        assert abs(alpha["cpu_hours"][part] - cpu_hours("done", "broke", part=part)) < 1e-6, part
        assert abs(by_project["beta"]["cpu_hours"][part] - cpu_hours("stopped", part=part)) < 1e-6, part
    assert alpha["gpu_hours"]["allocated"] == 0
    users = {r["key"]: r for r in http.get("/v1/usage", params={"group_by": "user"}, headers=admin).json()["items"]}
    assert set(users) >= {"ana", "bob", "cy"} and users["bob"]["attempts"] == 1
    assert abs(users["ana"]["cpu_hours"]["lost"]) < 1e-9
    per_job = http.get("/v1/usage", params={"group_by": "job"}, headers=bearer(token)).json()["items"]
    assert {r["key"] for r in per_job} == {str(ids["done"]), str(ids["broke"])}  # alpha's own only
    assert abs(sum(r["cpu_hours"]["allocated"] for r in per_job) - alpha["cpu_hours"]["allocated"]) < 1e-9

    # A project token sees its own project; CSV carries the same figures.
    mine = http.get("/v1/usage", headers=bearer(token)).json()["items"]
    assert [r["key"] for r in mine] == ["alpha"]
    text = http.get("/v1/usage", headers=bearer(token) | {"Accept": "text/csv"})
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/csv")
    [row] = list(csv.DictReader(io.StringIO(text.text)))
    assert row["key"] == "alpha" and abs(float(row["cpu_hours_lost"]) - alpha["cpu_hours"]["lost"]) < 1e-5
    # Read through the day rollups (the range ends at tomorrow's midnight, so today is a whole day), and
    # through the hour rollups alone (hourly periods): the same figures.
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    for params in ({"to": midnight.isoformat()}, {"granularity": "hour"}):
        [again] = http.get("/v1/usage", params=params, headers=bearer(token)).json()["items"]
        assert again["attempts"] == 2 and abs(again["cpu_hours"]["lost"] - alpha["cpu_hours"]["lost"]) < 1e-9, params
    daily = http.get("/v1/usage", params={"granularity": "day"}, headers=bearer(token)).json()["items"]
    assert len(daily) == 1 and daily[0]["period"] is not None

    # Prometheus counters per project (behind /metrics auth), from the same rollups.
    scraped = http.get("/metrics", headers=admin).text
    lost = 'trainmaster_usage_resource_seconds_total{part="lost",project="alpha",resource="CPU"}'
    [line] = [line for line in scraped.splitlines() if line.startswith(lost)]
    assert abs(float(line.split()[-1]) - alpha["cpu_hours"]["lost"] * 3600) < 1e-3, line
    assert 'trainmaster_usage_attempts_total{project="beta"} 1.0' in scraped

    for bad, field in (({"group_by": "team"}, "group_by"), ({"granularity": "week"}, "granularity")):
        refused = http.get("/v1/usage", params=bad, headers=bearer(token))
        assert refused.status_code == 422 and field in refused.text, refused.text
    assert http.get("/v1/usage", params={"project": "beta"}, headers=bearer(token)).status_code == 422
    assert http.get("/v1/usage").status_code == 401
