"""Priority preemption on a real PostgreSQL with the exact in-memory Ray (tests/factories/ray.py)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update

from api.db.models import Checkpoint, Job, JobEvent
from api.dispatcher.backend import RayJobState
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus


def whole_cluster(priority: int) -> dict[str, Any]:
    return {"priority": priority, "scaling": {"num_workers": 4, "resources_per_worker": {"CPU": 1}}}


async def running_low(world: World, project: str = "alpha") -> uuid.UUID:
    """A priority-0 job holding the whole 4-CPU cluster, running."""
    low = await world.submit(project, **whole_cluster(0))
    dispatcher = world.dispatcher()
    assert await dispatcher.admit_round() == 1
    world.ray.jobs[f"tm-{low}-1"] = RayJobState.RUNNING
    await dispatcher.reconcile_round()
    assert (await world.job(low)).status is JobStatus.running
    world.ray.used_cpus = 4  # what Ray shows while the gang holds the cluster
    return low


def kinds(events: list[Any]) -> list[str]:
    return [e.kind for e in events]


def test_preemption_is_off_by_default(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            low = await running_low(world)
            high = await world.submit("beta", **whole_cluster(10))
            await world.dispatcher().admit_round()
            assert "preempt_requested" not in kinds(await world.events(low))
            assert "waiting for resources" in ((await world.job(high)).pending_reason or "")

    run(scenario())


def test_a_higher_priority_gang_preempts_checkpoints_then_runs_and_the_low_one_resumes(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption=True, preemption_grace_s=600) as world:
            low = await running_low(world)
            high = await world.submit("beta", **whole_cluster(10))
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            assert (await world.job(high)).pending_reason.startswith("preempting 1 lower-priority job(s)")  # type: ignore[union-attr]
            assert (await world.job(low)).preempted_by == high
            await dispatcher.reconcile_round()  # no checkpoint yet, grace not over: keeps running
            assert world.ray.stopped == []

            async def checkpoint(session: Any) -> None:
                session.add(Checkpoint(job_id=low, attempt=1, path="/ckpt/low-step-37", step=37))

            await world.execute(checkpoint)  # the training code saved its work
            await dispatcher.reconcile_round()
            assert world.ray.stopped == [f"tm-{low}-1"]
            await dispatcher.reconcile_round()  # Ray reports it stopped
            preempted = await world.job(low)
            assert preempted.status is JobStatus.queued
            assert preempted.pending_reason == f"preempted by {high}; waits to be admitted again"
            assert [(a.status, a.error) for a in await world.attempts(low)] == [("stopped", f"preempted by {high}")]

            world.ray.used_cpus = 0
            assert await dispatcher.admit_round() == 1  # the high gang goes first; the low one waits
            assert (await world.job(high)).status is JobStatus.starting
            assert (await world.job(low)).status is JobStatus.queued
            world.ray.jobs[f"tm-{high}-1"] = RayJobState.SUCCEEDED
            await dispatcher.reconcile_round()
            assert await dispatcher.admit_round() == 1  # max_retries is 0, yet the low job runs again
            assert [a.n for a in await world.attempts(low)] == [1, 2]
            assert (await world.job(low)).status is JobStatus.starting

    run(scenario())


def test_a_job_that_reads_the_flag_is_stopped_only_at_a_checkpoint_saved_after_it_saw_the_request(
    database_url: str,
) -> None:
    """An epoch's checkpoint registered after the request but before the training code looked is not
    the answer: stopped there, the job would have trained on until the stop and redone those steps
    (seen in the e2e preemption test under load). The one saved after `preempt_seen` is."""

    async def scenario() -> None:
        async with World(database_url, preemption=True, preemption_grace_s=600) as world:
            low = await running_low(world)

            def event(kind: str) -> Any:
                async def add(session: Any) -> None:
                    session.add(JobEvent(job_id=low, kind=kind, message=kind, data={"attempt": 1}))

                return add

            def checkpoint(step: int) -> Any:
                async def add(session: Any) -> None:
                    session.add(Checkpoint(job_id=low, attempt=1, path=f"/ckpt/low-{step}", step=step))

                return add

            await world.execute(event("checkpoint_reader"))  # its training code asks should_checkpoint()
            high = await world.submit("beta", **whole_cluster(10))
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            assert (await world.job(low)).preempted_by == high
            await world.execute(checkpoint(32))  # the epoch's end, reported before it looked
            await dispatcher.reconcile_round()
            assert world.ray.stopped == []
            await world.execute(event("preempt_seen"))
            await dispatcher.reconcile_round()
            assert world.ray.stopped == []  # seen, not yet saved
            await world.execute(checkpoint(33))  # saved when asked
            await dispatcher.reconcile_round()
            assert world.ray.stopped == [f"tm-{low}-1"]

    run(scenario())


def test_without_a_checkpoint_the_job_is_stopped_after_the_grace(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption=True, preemption_grace_s=0) as world:
            low = await running_low(world)
            await world.submit("beta", **whole_cluster(10))
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            await dispatcher.reconcile_round()  # a later transaction: past a grace of 0 s on the database's clock
            assert world.ray.stopped == [f"tm-{low}-1"]

    run(scenario())


def test_a_guaranteed_share_is_never_preempted_and_equal_priority_never(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption=True, guaranteed_shares={"alpha": {"CPU": 4}}) as world:
            low = await running_low(world)
            await world.submit("beta", **whole_cluster(10))
            await world.dispatcher().admit_round()
            assert "preempt_requested" not in kinds(await world.events(low))

        async with World(database_url, preemption=True) as world:
            await world.execute(lambda s: s.execute(update(Job).values(status="cancelled")))
            low = await running_low(world)
            same = await world.submit("beta", **whole_cluster(0))
            await world.dispatcher().admit_round()
            assert "preempt_requested" not in kinds(await world.events(low))
            assert (await world.job(same)).status is JobStatus.queued

    run(scenario())


def test_only_as_many_victims_as_the_gang_needs(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption=True) as world:
            world.ray.cpus = 4
            lows = [await world.submit("alpha", priority=p, **one_worker()) for p in (0, 1, 2, 3)]
            dispatcher = world.dispatcher()
            assert await dispatcher.admit_round() == 4
            for low in lows:
                world.ray.jobs[f"tm-{low}-1"] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            world.ray.used_cpus = 4
            high = await world.submit("beta", priority=10, scaling={"num_workers": 2})
            await dispatcher.admit_round()
            asked = [low for low in lows if (await world.job(low)).preempted_by == high]
            assert asked == lows[:2]  # the two lowest priorities, and no more

    run(scenario())


def elastic(priority: int, min_workers: int) -> dict[str, Any]:
    scaling = {"num_workers": {"min": min_workers, "max": 4}, "resources_per_worker": {"CPU": 1}}
    return {"priority": priority, "scaling": scaling}


async def running_elastic_at_max(world: World, min_workers: int) -> uuid.UUID:
    """A priority-0 elastic gang admitted at its min, grown to 4 workers (its `resized` event): the cluster."""
    low = await world.submit("alpha", **elastic(0, min_workers))
    dispatcher = world.dispatcher()
    assert await dispatcher.admit_round() == 1
    world.ray.jobs[f"tm-{low}-1"] = RayJobState.RUNNING
    await dispatcher.reconcile_round()
    await resize(world, low, 4)
    world.ray.used_cpus = 4
    return low


async def resize(world: World, job_id: uuid.UUID, to: int) -> None:
    """What the job's controller posts when Ray Train restarted its group at `to` workers."""
    from api.auth.principal import Principal
    from api.jobs import service as jobs
    from api.limits.service import WriteLimits
    from trainmaster.models import JobEventIn

    async def post(session: Any) -> None:
        job = await session.get(Job, job_id)
        principal = Principal(project_id=job.project_id, project_name="alpha")
        event = JobEventIn(kind="resized", message=f"-> {to}", data={"to": to})
        await jobs.add_event(session, principal, str(job_id), event, WriteLimits(world.settings))

    await world.execute(post)


def test_an_elastic_gang_is_shrunk_before_anything_is_preempted(database_url: str) -> None:
    async def scenario() -> None:
        from api.auth.principal import Principal
        from api.jobs import service as jobs

        async with World(database_url, preemption=True, preemption_grace_s=600) as world:
            low = await running_elastic_at_max(world, min_workers=1)
            high = await world.submit(
                "beta", priority=10, scaling={"num_workers": 2, "resources_per_worker": {"CPU": 1}}
            )
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            waiting = await world.job(high)
            assert (waiting.pending_reason or "").startswith("shrinking 1 elastic job(s) to make room"), (
                waiting.pending_reason
            )
            shrunk = await world.job(low)
            assert (shrunk.shrink_to, shrunk.preempted_by, shrunk.preempt_requested_at) == (2, high, None)
            assert "shrink_requested" in kinds(await world.events(low))
            assert "preempt_requested" not in kinds(await world.events(low))
            assert "shrinking" in kinds(await world.events(high))

            async def control(session: Any) -> Any:
                job = await session.get(Job, low)
                return await jobs.control(session, Principal(project_id=job.project_id, project_name="alpha"), str(low))

            async with world.sessions() as session:
                asked = await control(session)
            assert (asked.max_workers, asked.checkpoint) == (2, False)  # what its scaling policy reads

            await dispatcher.admit_round()  # not shrunk yet: the same ask, nothing more
            assert (await world.job(high)).status is JobStatus.queued
            assert kinds(await world.events(low)).count("shrink_requested") == 1

            await resize(world, low, 2)  # Ray Train restarted the group at 2 workers
            # Ray frees the old group's placement a moment later: meanwhile the high gang still waits on
            # the shrink, and nobody is preempted for it (it was, before shrink_requested_at).
            assert await dispatcher.admit_round() == 0
            assert (await world.job(high)).pending_reason.startswith("shrinking 1 elastic job(s)")  # type: ignore[union-attr]
            assert "preempt_requested" not in kinds(await world.events(low))
            world.ray.used_cpus = 2
            assert await dispatcher.admit_round() == 1
            assert (await world.job(high)).status is JobStatus.starting
            after = await world.job(low)
            assert (after.status, after.gang_cpus, after.shrink_to) == (JobStatus.running, 2, 2)
            assert [a.n for a in await world.attempts(low)] == [1]  # the same attempt: never stopped
            assert world.ray.stopped == []

            async with world.sessions() as session:
                assert (await control(session)).max_workers == 2  # while the high gang runs, the cap holds
            world.ray.jobs[f"tm-{high}-1"] = RayJobState.SUCCEEDED
            await dispatcher.reconcile_round()
            assert (await world.job(high)).status is JobStatus.succeeded
            async with world.sessions() as session:
                lifted = await control(session)
            assert (lifted.max_workers, lifted.checkpoint) == (None, False)  # it may grow back to its max
            assert "lifted" in (lifted.reason or "")

    run(scenario())


def test_a_job_is_preempted_whole_only_when_shrinking_cannot_free_enough(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, preemption=True, preemption_grace_s=600) as world:
            low = await running_elastic_at_max(world, min_workers=3)  # can give back one worker only
            high = await world.submit("beta", **whole_cluster(10))
            await world.dispatcher().admit_round()
            assert (await world.job(high)).pending_reason.startswith("preempting 1 lower-priority job(s)")  # type: ignore[union-attr]
            victim = await world.job(low)
            assert (victim.shrink_to, victim.preempted_by) == (None, high)
            assert "shrink_requested" not in kinds(await world.events(low))

    run(scenario())
