"""Fair sharing over a decayed usage history (issue 28 item 3), on a real PostgreSQL with real admission
rounds (the exact fake Ray of tests/factories/ray.py): a project that held the whole cluster for a day
yields to one that used nothing, although its job is older; the queue positions the API answers are
that order; ten half-lives later the history has faded and the order follows it."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import text, update

from api.db.models import Job
from tests.factories.auth import project_token
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus

DAY = 86400  # the default half-life


async def days_pass(world: World, days: float) -> None:
    """Every project's last sample moves `days` back: the next round's sample weighs that much time."""
    await world.execute(
        lambda s: s.execute(
            text("UPDATE project_usage SET sampled_at = sampled_at - make_interval(secs => :s)"), {"s": days * DAY}
        )
    )


async def shares(world: World) -> dict[str, float]:
    async with world.sessions() as session:
        rows = await session.execute(
            text("SELECT p.name, u.share FROM project_usage u JOIN projects p ON p.id = u.project_id")
        )
        return {name: float(share) for name, share in rows.all()}


def positions(http: TestClient, tokens: dict[str, str], jobs: dict[str, tuple[str, uuid.UUID]]) -> dict[str, int]:
    """Each job's queue position, as its project's token reads it from the API."""
    found = {}
    for name, (project, job_id) in jobs.items():
        answer = http.get(f"/v1/jobs/{job_id}", headers=bearer(tokens[project]))
        assert answer.status_code == 200, answer.text
        found[name] = answer.json()["queue_position"]
    return found


def test_a_project_that_used_the_cluster_yesterday_yields_until_its_history_fades(
    http: TestClient, database_url: str
) -> None:
    tokens = {project: project_token(database_url, project) for project in ("alpha", "beta")}

    async def yesterday() -> dict[str, tuple[str, uuid.UUID]]:
        """alpha held all 4 CPUs for a day (a half-life), then its jobs ended; then alpha submits, then beta."""
        async with World(database_url) as world:
            world.ray.cpus = 4
            ran = [await world.submit("alpha", **one_worker()) for _ in range(4)]
            assert await world.dispatcher().admit_round() == 4
            await world.dispatcher().admit_round()  # the first sample: the capacities only
            await days_pass(world, 1)
            # alpha held all of it for the whole time its history covers, a half-life: history 1.0 (not 0.5:
            # the time before its first job is not time it held nothing).
            await world.dispatcher().admit_round()
            await world.execute(lambda s: s.execute(update(Job).where(Job.id.in_(ran)).values(status="succeeded")))
            assert abs((await shares(world))["alpha"] - 1.0) < 1e-6  # holds nothing now
            return {
                "alpha": ("alpha", await world.submit("alpha", **one_worker())),
                "beta": ("beta", await world.submit("beta", **one_worker())),
            }

    jobs = run(yesterday())
    assert positions(http, tokens, jobs) == {"beta": 1, "alpha": 2}  # beta used nothing: ahead of the older job
    queues = http.get("/v1/queues", headers=bearer(tokens["beta"]))
    shown = {item["project"]: item["fair_share"] for item in queues.json()["items"]}
    assert abs(shown["alpha"] - 1.0) < 1e-6 and shown["beta"] == 0, shown  # what `trainmaster queue` shows

    async def room_for_one() -> None:
        async with World(database_url) as world:
            world.ray.cpus, world.ray.used_cpus = 4, 3
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(jobs["beta"][1])).status is JobStatus.starting
            assert (await world.job(jobs["alpha"][1])).status is JobStatus.queued

    run(room_for_one())

    async def ten_days_later() -> uuid.UUID:
        """alpha's history is a two-thousandth of what it was; beta has held a quarter of the cluster for
        all the ten days its history covers."""
        async with World(database_url) as world:
            world.ray.cpus, world.ray.used_cpus = 4, 4
            await days_pass(world, 10)
            await world.dispatcher().admit_round()  # samples; no room
            now = await shares(world)
            assert now["alpha"] < 0.001 and abs(now["beta"] - (0.25 + 0.25)) < 1e-6, now
            return await world.submit("beta", **one_worker())

    later = run(ten_days_later())
    waiting = {"alpha": jobs["alpha"], "beta": ("beta", later)}
    assert positions(http, tokens, waiting) == {"alpha": 1, "beta": 2}

    async def room_again() -> None:
        async with World(database_url) as world:
            world.ray.cpus, world.ray.used_cpus = 4, 3
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(jobs["alpha"][1])).status is JobStatus.starting
            assert (await world.job(later)).status is JobStatus.queued

    run(room_again())


def test_each_job_carries_its_projects_share_with_the_gangs_of_its_project_ahead_of_it(
    http: TestClient, database_url: str
) -> None:
    """DRF's progressive filling: beta has some history (0.1 of the cluster's 16 CPUs), alpha none. With
    every job of a project carrying its project's share, all of alpha's jobs came first and a round with
    room for three admitted alpha's three. Each job now adds its 1-CPU gang to its project's share for
    the jobs behind it (alpha 0, 1/16, 2/16; beta 0.1, 0.1625, 0.225): the positions and the round
    interleave the projects. alpha has no usage row: its share is of the cluster's capacity (beta's)."""
    tokens = {project: project_token(database_url, project) for project in ("alpha", "beta")}

    async def submitted() -> dict[str, tuple[str, uuid.UUID]]:
        async with World(database_url) as world:
            jobs = {}
            for n in range(3):
                jobs[f"alpha{n}"] = ("alpha", await world.submit("alpha", **one_worker()))
                jobs[f"beta{n}"] = ("beta", await world.submit("beta", **one_worker()))
            await world.execute(
                lambda s: s.execute(
                    text(
                        "INSERT INTO project_usage (project_id, active, gpus, cpus, history_cpus, history_weight,"
                        " cpu_capacity, gpu_capacity, sampled_at)"
                        " SELECT id, 0, 0, 0, 0.1, 1, 16, 0, now() FROM projects WHERE name = 'beta'"
                    )
                )
            )
            return jobs

    jobs = run(submitted())
    assert positions(http, tokens, jobs) == {"alpha0": 1, "alpha1": 2, "beta0": 3, "alpha2": 4, "beta1": 5, "beta2": 6}
    listed = http.get("/v1/jobs", headers=bearer(tokens["beta"])).json()["items"]
    assert sorted(item["queue_position"] for item in listed) == [3, 5, 6]  # a page counts the same

    async def room_for_three() -> set[uuid.UUID]:
        async with World(database_url) as world:
            world.ray.cpus, world.ray.used_cpus = 16, 13
            assert await world.dispatcher().admit_round() == 3
            async with world.sessions() as session:
                rows = await session.execute(text("SELECT id FROM jobs WHERE status = 'starting'"))
                return {row[0] for row in rows.all()}

    assert run(room_for_three()) == {jobs[name][1] for name in ("alpha0", "alpha1", "beta0")}
