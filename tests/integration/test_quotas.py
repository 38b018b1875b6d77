"""Project quotas and cohorts on a real PostgreSQL: the admin API that sets them, and dispatcher
rounds (Ray replaced by the exact fake of tests/factories/ray.py) that admit within them, lend unused
quota inside a cohort, reclaim it by preemption and never let a preempted borrower take it back.

The rules alone are in tests/unit/test_quotas.py.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select, text, update

from api.auth.repository import get_or_create_project
from api.db.models import Checkpoint, Job, Project, ProjectUsage
from tests.factories.auth import scoped_token
from tests.factories.http import bearer
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus


def test_quota_fields_set_read_and_refused_when_bad(http: TestClient, token: str, database_url: str) -> None:
    admin = bearer(scoped_token(database_url, "default", "admin"))
    body = {"name": "vision", "quota": {"GPU": 8, "CPU": 64}, "cohort": "research", "lending_limit": {"GPU": 2}}
    created = http.post("/v1/projects", json=body, headers=admin)
    assert created.status_code == 201, created.text
    project = created.json()
    assert project["quota"] == {"GPU": 8, "CPU": 64} and project["cohort"] == "research"
    assert project["lending_limit"] == {"GPU": 2} and project["borrowing_limit"] is None
    assert project["usage"] == {"CPU": 0, "GPU": 0}

    for bad, where in (
        ({"quota": {"memory": 2**30}}, ["body", "quota", "memory", "[key]"]),
        ({"quota": {"GPU": -1}}, ["body", "quota", "GPU"]),
        ({"quota": {"GPU": "lots"}}, ["body", "quota", "GPU"]),
        ({"borrowing_limit": {"TPU": 1}}, ["body", "borrowing_limit", "TPU", "[key]"]),
        ({"cohort": "no spaces"}, ["body", "cohort"]),
    ):
        response = http.patch("/v1/projects/vision", json=bad, headers=admin)
        assert response.status_code == 422, (bad, response.text)
        assert where in [item["loc"] for item in response.json()["detail"]], (bad, response.json())
    assert http.get("/v1/projects/vision", headers=admin).json()["quota"] == {"GPU": 8, "CPU": 64}  # unchanged

    changed = http.patch("/v1/projects/vision", json={"quota": {"GPU": 4}, "cohort": None}, headers=admin)
    assert changed.status_code == 200, changed.text
    assert changed.json()["quota"] == {"GPU": 4} and changed.json()["cohort"] is None
    assert changed.json()["lending_limit"] == {"GPU": 2}  # left out: kept
    # A project token reads its own project's quota and usage; it cannot set one.
    assert http.get("/v1/projects/alpha", headers=bearer(token)).json()["quota"] == {}
    assert http.patch("/v1/projects/alpha", json={"quota": {"GPU": 100}}, headers=bearer(token)).status_code == 403


async def set_quota(world: World, project: str, **values: Any) -> None:
    async def change(session: Any) -> None:
        row = await get_or_create_project(session, project)
        await session.execute(update(Project).where(Project.id == row.id).values(**values))

    await world.execute(change)


async def running(world: World, *job_ids: uuid.UUID) -> None:
    await world.execute(
        lambda s: s.execute(update(Job).where(Job.id.in_(job_ids)).values(status="running", started_at=func.now()))
    )


def test_admission_keeps_each_project_within_its_quota(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus = 8
            await set_quota(world, "alpha", quota={"CPU": 2})
            alpha = [await world.submit("alpha", **one_worker()) for _ in range(3)]
            too_big = await world.submit("alpha", **one_worker(cpus=3))
            beta = await world.submit("beta", **one_worker(cpus=3))  # no quota: not limited

            assert await world.dispatcher().admit_round() == 3
            statuses = [(await world.job(job_id)).status for job_id in alpha]
            assert statuses == [JobStatus.starting, JobStatus.starting, JobStatus.queued]
            assert (await world.job(beta)).status is JobStatus.starting
            held = await world.job(alpha[2])
            assert held.pending_reason == (
                "waiting for its project's quota: needs 1 CPU; project alpha holds 2 of its quota of 2 CPU."
            )
            never = await world.job(too_big)
            assert never.status is JobStatus.queued  # an admin may raise the quota: it waits, saying so
            assert (never.pending_reason or "").startswith("can never fit its project's quota as it is: needs 3 CPU")

            # The quota raised: the next round admits what now fits it.
            await set_quota(world, "alpha", quota={"CPU": 3})
            await world.dispatcher().admit_round()
            assert (await world.job(alpha[2])).status is JobStatus.starting
            assert (await world.job(too_big)).status is JobStatus.queued

    run(scenario())


def test_jobs_that_wait_at_the_head_of_the_queue_do_not_stop_other_projects(database_url: str) -> None:
    """The first `admit_batch` jobs in admission order all wait for their project's quota (here alpha's,
    urgent): the round reads on past them, leaving alpha out, and admits the other projects' jobs in
    the same round. Alpha's later job, which would fit its quota, is not read: it would pass alpha's
    waiting gangs without being seen to."""

    async def scenario() -> None:
        async with World(database_url, admit_batch=2) as world:
            world.ray.cpus = 8
            await set_quota(world, "alpha", quota={"CPU": 2})
            busy = await world.submit("alpha", **one_worker())
            await running(world, busy)  # alpha holds 1 of its 2 CPUs
            waiting = [await world.submit("alpha", priority=5, **one_worker(cpus=2)) for _ in range(2)]
            small = await world.submit("alpha", priority=5, **one_worker())
            others = [await world.submit(project, **one_worker()) for project in ("beta", "gamma")]

            assert await world.dispatcher().admit_round() == 2
            assert [(await world.job(job_id)).status for job_id in others] == [JobStatus.starting] * 2
            for job_id in waiting:
                job = await world.job(job_id)
                assert job.status is JobStatus.queued
                assert job.pending_reason == (
                    "waiting for its project's quota: needs 2 CPU; project alpha holds 1 of its quota of 2 CPU."
                )
            assert (await world.job(small)).status is JobStatus.queued

    run(scenario())


def test_a_starving_gang_keeps_its_cohorts_lending_from_other_members_later_borrowers(database_url: str) -> None:
    """Bounded waits across a cohort, through real rounds: alpha's 4-CPU gang waits to borrow and later
    jobs of alpha have passed it for two hours. Beta's smaller borrower would take what the cohort lends
    as it frees, as such borrowers do all day: it waits behind alpha's gang instead, while gamma's job
    within its own quota runs. Once beta's running job ends, what the cohort lends is enough and the
    gang is admitted."""

    async def scenario() -> None:
        async with World(database_url, starvation_s=3600) as world:
            world.ray.cpus = 8
            await set_quota(world, "alpha", quota={"CPU": 1}, cohort="research")
            await set_quota(world, "beta", quota={"CPU": 1}, cohort="research")
            await set_quota(world, "gamma", quota={"CPU": 4}, cohort="research")  # lends what it leaves unused
            alpha_busy = await world.submit("alpha", **one_worker())
            beta_busy = await world.submit("beta", **one_worker(cpus=2))  # borrows 1 of gamma's
            assert await world.dispatcher().admit_round() == 2
            await running(world, alpha_busy, beta_busy)
            world.ray.used_cpus = 3
            big = await world.submit("alpha", priority=1, **one_worker(cpus=4))
            await world.execute(
                lambda s: s.execute(
                    update(Job).where(Job.id == big).values(bypassed_since=func.now() - text("interval '2 hours'"))
                )
            )
            borrower = await world.submit("beta", **one_worker(cpus=2))  # borrows, even with beta idle
            owed = await world.submit("gamma", **one_worker())

            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(owed)).status is JobStatus.starting
            starving = await world.job(big)
            assert starving.status is JobStatus.queued
            assert "borrows 0 from cohort research, which has 2 CPU left to lend" in (starving.pending_reason or "")
            held = await world.job(borrower)
            assert held.status is JobStatus.queued
            assert (held.pending_reason or "").startswith(
                f"waiting behind job {big} of project alpha, which waits for what their cohort lends"
            ), held.pending_reason

            # Beta's running job ends: beta lends its quota too, and the cohort has the 3 CPUs alpha borrows.
            await world.execute(lambda s: s.execute(update(Job).where(Job.id == beta_busy).values(status="succeeded")))
            await running(world, owed)
            world.ray.used_cpus = 2
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(big)).status is JobStatus.starting
            assert (await world.job(borrower)).status is JobStatus.queued

    run(scenario())


def test_cohort_lends_unused_quota_and_reclaims_it_by_preempting_the_cheapest_borrower(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption_grace_s=60) as world:
            world.ray.cpus = 3
            await set_quota(world, "alpha", quota={"CPU": 1}, cohort="research")
            await set_quota(world, "beta", quota={"CPU": 2}, cohort="research")
            await set_quota(world, "gamma", quota={"CPU": 5}, cohort="elsewhere")  # lends nothing to alpha
            alpha = [await world.submit("alpha", **one_worker()) for _ in range(4)]
            assert await world.dispatcher().admit_round() == 3  # 1 of its own, 2 borrowed from beta
            fourth = await world.job(alpha[3])
            assert fourth.status is JobStatus.queued
            assert "borrows 2 from cohort research, which has 0 CPU left to lend" in (fourth.pending_reason or "")
            await running(world, *alpha[:3])
            world.ray.used_cpus = 3

            # alpha[1] checkpointed a moment ago: the least work lost, so the one preempted.
            async def checkpoint(session: Any) -> None:
                session.add(Checkpoint(job_id=alpha[1], attempt=1, path="/c/1", step=10))

            await world.execute(checkpoint)

            owed = await world.submit("beta", **one_worker())  # within beta's own quota
            assert await world.dispatcher().admit_round() == 0
            waiting = await world.job(owed)
            assert waiting.status is JobStatus.queued
            assert (waiting.pending_reason or "").startswith("reclaiming its quota from cohort research")
            asked = {job_id: (await world.job(job_id)).preempt_requested_at is not None for job_id in alpha[:3]}
            assert asked == {alpha[0]: False, alpha[1]: True, alpha[2]: False}
            [event] = [e for e in await world.events(alpha[1]) if e.kind == "preempt_requested"]
            assert event.data["reclaim"] is True and "reclaims its quota" in event.message
            # The next round waits for that victim; it asks nothing more of anyone.
            await world.dispatcher().admit_round()
            assert sum([(await world.job(j)).preempt_requested_at is not None for j in alpha[:3]]) == 1

            # The victim stops and is queued again, at a higher priority than the job that reclaimed:
            # a job that would borrow comes after one within its quota, so beta gets its CPU back.
            await world.execute(
                lambda s: s.execute(
                    update(Job)
                    .where(Job.id == alpha[1])
                    .values(status="queued", priority=50, preempted_by=None, preempt_requested_at=None)
                )
            )
            world.ray.used_cpus = 2
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(owed)).status is JobStatus.starting
            victim = await world.job(alpha[1])
            assert victim.status is JobStatus.queued
            assert "borrows 1 from cohort research, which has 0 CPU left to lend" in (victim.pending_reason or "")

    run(scenario())


def test_fair_share_preemption_takes_borrowed_quota_back_from_the_project_far_above_in_share(
    database_url: str,
) -> None:
    """Two borrowers in one cohort: alpha borrows all that gamma lends, beta then waits for the cohort's
    lending. With equal histories nothing is preempted (they would take turns); once alpha has used
    much more before, its cheapest borrowed job goes for beta's, with events saying why."""

    async def scenario() -> None:
        async with World(database_url, fair_share_preemption=True, preemption_grace_s=60) as world:
            world.ray.cpus = 4
            await set_quota(world, "alpha", quota={"CPU": 1}, cohort="r")
            await set_quota(world, "beta", quota={"CPU": 1}, cohort="r")
            await set_quota(world, "gamma", quota={"CPU": 2}, cohort="r")  # idle: lends its 2
            alpha = [await world.submit("alpha", **one_worker()) for _ in range(3)]
            first = await world.submit("beta", **one_worker())
            assert await world.dispatcher().admit_round() == 4  # alpha: 1 its own, 2 borrowed; beta 1
            await running(world, *alpha, first)
            world.ray.used_cpus = 4
            second = await world.submit("beta", **one_worker())  # would borrow: the cohort has none left

            await world.dispatcher().admit_round()
            waiting = await world.job(second)
            assert "borrows 0 from cohort r, which has 0 CPU left to lend" in (waiting.pending_reason or "")
            assert [(await world.job(j)).preempt_requested_at for j in alpha] == [None, None, None]

            # alpha used most of the cluster for a long while before: far above beta in fair share.
            await world.execute(
                lambda s: s.execute(
                    update(ProjectUsage)
                    .where(
                        ProjectUsage.project_id == select(Project.id).where(Project.name == "alpha").scalar_subquery()
                    )
                    .values(history_cpus=0.6)
                )
            )
            await world.dispatcher().admit_round()
            waiting = await world.job(second)
            assert waiting.status is JobStatus.queued
            assert (waiting.pending_reason or "").startswith(
                "preempting 1 job(s) on borrowed quota for fair share in cohort r"
            ), waiting.pending_reason
            asked = [j for j in alpha if (await world.job(j)).preempt_requested_at is not None]
            assert len(asked) == 1 and (await world.job(first)).preempt_requested_at is None
            [event] = [e for e in await world.events(asked[0]) if e.kind == "preempt_requested"]
            assert event.data["fair_share"] is True and "fair share in cohort r: project alpha" in event.message
            # Asked once: the next round waits for that victim.
            await world.dispatcher().admit_round()
            assert sum([(await world.job(j)).preempt_requested_at is not None for j in alpha]) == 1

            # The victim stops and is queued again; beta's job takes what the cohort lends now.
            await world.execute(
                lambda s: s.execute(
                    update(Job)
                    .where(Job.id == asked[0])
                    .values(status="queued", preempted_by=None, preempt_requested_at=None)
                )
            )
            world.ray.used_cpus = 3
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(second)).status is JobStatus.starting
            assert (await world.job(asked[0])).status is JobStatus.queued

    run(scenario())


def test_a_borrower_is_not_preempted_below_its_own_quota(database_url: str) -> None:
    """Reclaim takes back only what is borrowed: when the borrower's jobs within its own quota are
    all that would free enough, nothing is preempted and the reason says what the job waits for."""

    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus = 3
            await set_quota(world, "alpha", quota={"CPU": 2}, cohort="r")
            await set_quota(world, "beta", quota={"CPU": 3}, cohort="r")
            alpha = [await world.submit("alpha", **one_worker(cpus=1.5)) for _ in range(2)]
            assert await world.dispatcher().admit_round() == 2  # 3 CPU: 2 its own, 1 borrowed
            await running(world, *alpha)
            world.ray.used_cpus = 3
            big = await world.submit("beta", **one_worker(cpus=3))  # within beta's 3, needs both gone
            await world.dispatcher().admit_round()
            waiting = await world.job(big)
            assert (waiting.pending_reason or "").startswith("waiting for resources")
            assert [(await world.job(j)).preempt_requested_at for j in alpha] == [None, None]

    run(scenario())


def test_queues_show_quota_usage_borrowed_lent_and_who_waits(http: TestClient, token: str, database_url: str) -> None:
    async def scenario() -> list[uuid.UUID]:
        async with World(database_url) as world:
            world.ray.cpus = 3
            await set_quota(world, "alpha", quota={"CPU": 1}, cohort="r")
            await set_quota(world, "beta", quota={"CPU": 2}, cohort="r")
            alpha = [await world.submit("alpha", **one_worker()) for _ in range(4)]
            assert await world.dispatcher().admit_round() == 3
            return alpha

    alpha = run(scenario())
    queues = http.get("/v1/queues", headers=bearer(token))
    assert queues.status_code == 200, queues.text
    body = queues.json()
    assert body["cluster"] == "default"
    by_project = {item["project"]: item for item in body["items"]}
    assert by_project["alpha"]["usage"] == {"CPU": 3, "GPU": 0} and by_project["alpha"]["borrowed"] == {"CPU": 2}
    assert by_project["beta"]["lent"] == {"CPU": 2} and by_project["beta"]["borrowed"] == {}
    assert by_project["alpha"]["waiting"] == 1
    [waiting] = by_project["alpha"]["jobs"]
    assert waiting["id"] == str(alpha[3]) and waiting["queue_position"] == 1
    assert "left to lend" in waiting["pending_reason"]
    assert http.get("/v1/queues", params={"limit": 1000}, headers=bearer(token)).status_code == 422
    assert http.get("/v1/queues").status_code == 401
