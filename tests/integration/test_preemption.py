"""Priority preemption on a real PostgreSQL with the exact in-memory Ray (tests/factories/ray.py)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update

from api.db.models import Checkpoint, Job
from api.dispatcher.backend import RayJobState
from tests.integration.test_dispatcher import World, one_worker, run
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
