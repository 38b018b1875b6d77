"""The dispatcher's decisions on a real PostgreSQL, with Ray replaced by an exact in-memory fake.

The same behaviours run against a real Ray head in tests/e2e/test_ray_jobs.py.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from api.db.models import Job, JobAttempt
from api.dispatcher.backend import RayJobState
from tests.factories.ray import FakeRay
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus


def test_admission_order_priority_then_fair_share_then_age(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus, world.ray.used_cpus = 3, 1
            busy = await world.submit("alpha", **one_worker())
            await world.execute(lambda s: s.execute(update(Job).where(Job.id == busy).values(status="running")))
            alpha_old = await world.submit("alpha", **one_worker())
            beta_new = await world.submit("beta", **one_worker())
            alpha_urgent = await world.submit("alpha", priority=5, **one_worker())

            assert await world.dispatcher().admit_round() == 2
            assert (await world.job(alpha_urgent)).status is JobStatus.starting
            assert (await world.job(beta_new)).status is JobStatus.starting  # beta holds nothing yet
            waiting = await world.job(alpha_old)
            assert waiting.status is JobStatus.queued
            assert "waiting for resources" in (waiting.pending_reason or "")

    run(scenario())


def test_attempt_is_recorded_before_submit_and_submitted_once(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            world.ray.down = True  # the head is unreachable at submit time
            world.ray.cluster = lambda: FakeRay().cluster()  # type: ignore[method-assign]
            await world.dispatcher().admit_round()
            [attempt] = await world.attempts(job_id)
            assert attempt.status == "pending" and attempt.ray_submission_id == f"tm-{job_id}-1"
            assert world.ray.submit_calls == {}

            world.ray.down = False
            await world.dispatcher().reconcile_round()  # never acknowledged: submitted now, same id
            await world.dispatcher().reconcile_round()
            assert world.ray.submit_calls == {f"tm-{job_id}-1": 1}
            assert [a.status for a in await world.attempts(job_id)] == ["submitted"]

    run(scenario())


def test_crash_after_submit_before_marking_does_not_resubmit(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            sub_id = f"tm-{job_id}-1"
            # As if the dispatcher died after Ray accepted the job but before marking the attempt.
            await world.execute(lambda s: s.execute(update(JobAttempt).values(status="pending")))
            world.ray.jobs[sub_id] = RayJobState.RUNNING
            await world.dispatcher().reconcile_round()
            assert world.ray.submit_calls[sub_id] == 1
            assert (await world.job(job_id)).status is JobStatus.running

    run(scenario())


def test_lease_fences_other_dispatchers_until_it_expires(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher("d1").admit_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await world.dispatcher("d2").reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.starting  # d2 holds no lease
            await world.execute(
                lambda s: s.execute(update(Job).values(lease_expires_at=Job.created_at))  # d1 went silent
            )
            await world.dispatcher("d2").reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.running and job.lease_owner == "d2"

    run(scenario())


def test_lost_attempt_is_retried_under_a_new_id_never_the_old_one(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(max_retries=1, **one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            world.ray.restart()
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.queued
            await dispatcher.admit_round()
            attempts = await world.attempts(job_id)
            assert [(a.n, a.status) for a in attempts] == [(1, "lost"), (2, "submitted")]
            assert "Ray no longer knows" in (attempts[0].error or "")
            assert world.ray.submit_calls == {f"tm-{job_id}-1": 1, f"tm-{job_id}-2": 1}

            world.ray.restart()  # lost again, no retries left
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.failed and "Ray no longer knows" in (job.error or "")

    run(scenario())


def test_failure_error_comes_from_the_driver_log(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            sub_id = f"tm-{job_id}-1"
            world.ray.jobs[sub_id] = RayJobState.FAILED
            world.ray.outputs[sub_id] = "epoch 0 ok\n[trainmaster] error: training failed: ValueError: bad lr -1\n"
            await world.dispatcher().reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.failed
            assert job.error == "training failed: ValueError: bad lr -1"

    run(scenario())


def test_a_driver_that_crashes_is_queued_again_not_retried_and_fails_after_the_bound(database_url: str) -> None:
    """A driver killed by a signal nobody asked for (here SIGABRT, as a failed check in Ray's core
    worker ends) is Ray's or the node's fault: queued again without spending the job's retries, at most
    DRIVER_CRASH_REQUEUES times; a driver's own error is a failure as before."""
    crash = "[trainmaster] job j attempt 1: builtin:mlp\n/lib/libpython3.11.so.1.0(+0x1c1461) [0x7f] type_call\n"

    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker(), max_retries=0)
            dispatcher = world.dispatcher()
            for n in (1, 2, 3):
                await dispatcher.admit_round()
                sub_id = f"tm-{job_id}-{n}"
                world.ray.jobs[sub_id] = RayJobState.FAILED
                world.ray.exit_codes[sub_id] = -6
                world.ray.outputs[sub_id] = crash
                await dispatcher.reconcile_round()
                job = await world.job(job_id)
                if n < 3:
                    assert job.status is JobStatus.queued, job.error
                    assert "its driver crashed (killed by SIGABRT, exit code -6)" in (job.pending_reason or "")
            assert job.status is JobStatus.failed
            assert (job.error or "").startswith("the job's driver crashed (killed by SIGABRT, exit code -6)")
            assert "back in the queue 2 times already" in (job.error or "")
            assert [a.status for a in await world.attempts(job_id)] == ["lost", "lost", "failed"]
            requeued = [e.data.get("crash") for e in await world.events(job_id) if e.data.get("requeued")]
            assert requeued == ["killed by SIGABRT, exit code -6"] * 2

            # the same exit, but the driver said why (its own error): a failure, no requeue
            other = await world.submit(**one_worker(), max_retries=0)
            await dispatcher.admit_round()
            sub_id = f"tm-{other}-1"
            world.ray.jobs[sub_id] = RayJobState.FAILED
            world.ray.exit_codes[sub_id] = 1
            world.ray.outputs[sub_id] = "[trainmaster] error: training failed: ValueError: bad lr -1\n"
            await dispatcher.reconcile_round()
            assert (await world.job(other)).status is JobStatus.failed

    run(scenario())


def test_cancel_stops_the_ray_job_then_ends_cancelled(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            sub_id = f"tm-{job_id}-1"
            world.ray.jobs[sub_id] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            await world.execute(lambda s: s.execute(update(Job).values(status="cancelling", cancel_requested=True)))
            await dispatcher.reconcile_round()
            assert world.ray.stopped == [sub_id]
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.cancelled and job.attempts[0].status == "stopped"

    run(scenario())


def test_infeasible_job_fails_after_the_timeout(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, infeasible_timeout_s=0) as world:
            job_id = await world.submit(scaling={"num_workers": 2, "use_gpu": True})
            await world.dispatcher().admit_round()  # first sighting: reason and event
            await world.dispatcher().admit_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.failed and "can never fit" in (job.error or "")

    run(scenario())


@pytest.mark.parametrize("owners", [["d1", "d2"], ["d1", "d2", "d3", "d4"]])
def test_concurrent_dispatchers_submit_each_attempt_once(database_url: str, owners: list[str]) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus = 1000
            ids = [await world.submit(**one_worker()) for _ in range(30)]
            dispatchers = [world.dispatcher(owner) for owner in owners]
            for _ in range(3):
                await asyncio.gather(
                    *(d.admit_round() for d in dispatchers), *(d.reconcile_round() for d in dispatchers)
                )
            assert sorted(world.ray.submit_calls) == sorted(f"tm-{job_id}-1" for job_id in ids)
            assert set(world.ray.submit_calls.values()) == {1}

    run(scenario())


def test_a_launch_ray_keeps_refusing_fails_the_attempt_with_the_reason(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, launch_timeout_s=0) as world:
            job_id = await world.submit(**one_worker())
            world.ray.refuse_submit = True
            await world.dispatcher().admit_round()
            events = [e.kind for e in await world.events(job_id)]
            assert "launch_retry" in events
            await world.dispatcher().reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.failed
            assert "No available agent" in (job.error or "") and "not launched" in (job.error or "")

    run(scenario())


def test_cancel_before_launch_ends_cancelled_without_touching_ray(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            world.ray.refuse_submit = True
            await world.dispatcher().admit_round()
            await world.execute(lambda s: s.execute(update(Job).values(status="cancelling", cancel_requested=True)))
            await world.dispatcher().reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.cancelled and world.ray.stopped == []

    run(scenario())


def test_ray_unreachable_past_the_bound_loses_active_attempts(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, ray_unreachable_timeout_s=0) as world:
            job_id = await world.submit(max_retries=1, **one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            world.ray.jobs[f"tm-{job_id}-1"] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            world.ray.down = True
            await dispatcher.reconcile_round()  # first sighting starts the clock (bound 0 s)
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.queued  # a retry, under a new attempt id once Ray is back
            [attempt] = await world.attempts(job_id)
            assert attempt.status == "lost" and "unreachable" in (attempt.error or "")

    run(scenario())


def test_past_the_reconcile_batch_every_active_job_is_followed_in_turn(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, reconcile_batch=2) as world:
            world.ray.cpus = 8
            ids = [await world.submit(**one_worker()) for _ in range(5)]
            dispatcher = world.dispatcher()
            assert await dispatcher.admit_round() == 5
            for sub_id in world.ray.jobs:
                world.ray.jobs[sub_id] = RayJobState.RUNNING
            for _ in range(3):  # 3 rounds x 2 jobs reach all 5
                await dispatcher.reconcile_round()
            statuses = [(await world.job(job_id)).status for job_id in ids]
            assert statuses == [JobStatus.running] * 5

    run(scenario())


def test_two_dispatchers_admitting_at_once_never_overcommit_the_cluster(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, admit_batch=4) as world:
            world.ray.cpus = 4  # Ray's own view lags: only the jobs already held count against it
            ids = [await world.submit(**one_worker()) for _ in range(8)]
            admitted = await asyncio.gather(world.dispatcher("d1").admit_round(), world.dispatcher("d2").admit_round())
            assert sum(admitted) == 4
            starting = [(await world.job(job_id)).status is JobStatus.starting for job_id in ids]
            assert sum(starting) == 4

    run(scenario())


class SkewedClock(datetime):
    """A dispatcher host whose clock runs an hour ahead of the database's."""

    @classmethod
    def now(cls, tz: Any = None) -> SkewedClock:  # type: ignore[override]
        return cls.fromtimestamp(datetime.now(tz).timestamp() + 3600, tz)


def test_leases_are_written_with_the_database_clock(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from api.dispatcher import admission, launch, leases, reconcile, repository

    for module in (admission, launch, leases, reconcile, repository):
        monkeypatch.setattr(module, "datetime", SkewedClock, raising=False)

    async def scenario() -> None:
        async with World(database_url, lease_s=30) as world:
            job_id = await world.submit(**one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            await dispatcher.reconcile_round()
            async with world.sessions() as session:
                left = await session.scalar(
                    select(func.extract("epoch", Job.lease_expires_at - func.now())).where(Job.id == job_id)
                )
            assert left is not None and 0 < float(left) <= 30

    run(scenario())


def test_running_means_the_workers_started_and_until_then_a_placement_reason(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, api_url="http://api:8000") as world:
            job_id = await world.submit(scaling={"num_workers": 2, "placement_strategy": "SPREAD"})
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            [sub_id] = world.ray.jobs
            world.ray.jobs[sub_id] = RayJobState.RUNNING  # the driver runs; its gang may not be placed
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.starting
            assert (job.pending_reason or "").startswith("placement group pending: 2 CPU as 2 x {CPU: 1} SPREAD")
            assert "nodes free: " in (job.pending_reason or "")
            [attempt] = await world.attempts(job_id)
            assert attempt.status == "running"  # the attempt's driver does run

            async def started(session: Any) -> None:
                from api.jobs.status import record_event

                row = await session.get(Job, job_id)
                await record_event(session, row, "workers_started", "2 workers", {"attempt": 1})

            await world.execute(started)
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.running and job.pending_reason is None

    run(scenario())


def test_timeout_is_per_job_and_a_retry_does_not_restart_it(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(timeout_s=30, max_retries=2, **one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            [first] = world.ray.jobs
            world.ray.jobs[first] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            await world.execute(  # the first attempt started 25 s ago, then failed
                lambda s: s.execute(
                    update(JobAttempt)
                    .where(JobAttempt.job_id == job_id)
                    .values(started_at=func.now() - timedelta(seconds=25))
                )
            )
            world.ray.jobs[first] = RayJobState.FAILED
            await dispatcher.reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.queued  # retried
            await dispatcher.admit_round()
            second = f"tm-{job_id}-2"
            world.ray.jobs[second] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.running  # 25 s of 30 used
            await world.execute(
                lambda s: s.execute(
                    update(JobAttempt)
                    .where(JobAttempt.job_id == job_id, JobAttempt.n == 1)
                    .values(started_at=func.now() - timedelta(seconds=40))
                )
            )
            await dispatcher.reconcile_round()  # 40 s since the job first started: stop it
            assert second in world.ray.stopped
            await dispatcher.reconcile_round()
            job = await world.job(job_id)
            assert job.status is JobStatus.timed_out
            assert [a.status for a in await world.attempts(job_id)] == ["failed", "timed_out"]

    run(scenario())


def test_logs_are_read_incrementally_and_stored_once_in_order(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            [sub_id] = world.ray.jobs
            world.ray.jobs[sub_id] = RayJobState.RUNNING
            world.ray.outputs[sub_id] = "line 1\nline 2\npart"
            await dispatcher.reconcile_round()
            world.ray.outputs[sub_id] += "ial 3\nline 4\n"
            await dispatcher.reconcile_round()
            world.ray.outputs[sub_id] += "[trainmaster] error: training failed: boom\n"
            world.ray.jobs[sub_id] = RayJobState.FAILED
            await dispatcher.reconcile_round()
            offsets = [offset for read, offset in world.ray.log_reads if read == sub_id]
            assert offsets == [0, len("line 1\nline 2\n"), len("line 1\nline 2\npartial 3\nline 4\n")]
            async with world.sessions() as session:
                from api.db.models import LogLine

                rows = await session.execute(select(LogLine.line).where(LogLine.job_id == job_id).order_by(LogLine.seq))
                assert list(rows.scalars()) == [
                    "line 1",
                    "line 2",
                    "partial 3",
                    "line 4",
                    "[trainmaster] error: training failed: boom",
                ]
            job = await world.job(job_id)
            assert job.status is JobStatus.failed and job.error == "training failed: boom"

    run(scenario())


def two_host_cluster() -> Any:
    """Two Ray nodes of 2 CPUs on two hosts."""
    from api.dispatcher.placement import ClusterCapacity, Node

    return ClusterCapacity(
        [
            Node("a" * 56, {"CPU": 2}, {"CPU": 2}, ip="10.0.0.1"),
            Node("b" * 56, {"CPU": 2}, {"CPU": 2}, ip="10.0.0.2"),
        ]
    )


def test_a_local_storage_path_on_a_cluster_of_several_hosts_is_flagged_before_the_job_runs(
    database_url: str,
) -> None:
    async def scenario() -> None:
        async with World(database_url, storage_path="/var/tm/ckpt") as world:
            two_hosts = two_host_cluster()
            world.ray.cluster = lambda: two_hosts  # type: ignore[method-assign]
            flagged = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            [warning] = [e for e in await world.events(flagged) if e.kind == "storage_warning"]
            assert "/var/tm/ckpt" in (warning.message or "") and "2 hosts" in (warning.message or "")
            assert (await world.job(flagged)).status is JobStatus.starting  # warned, not refused

        async with World(database_url, storage_path="s3://bucket/ckpt") as world:
            world.ray.cluster = lambda: two_hosts  # type: ignore[method-assign]
            shared = await world.submit(**one_worker())
            await world.dispatcher().admit_round()
            assert not [e for e in await world.events(shared) if e.kind == "storage_warning"]

    run(scenario())


def test_250_active_jobs_are_all_reconciled_cancelled_and_timed_out_in_bounds(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, admit_batch=300, reconcile_batch=200) as world:
            world.ray.cpus = 1000
            ids = [await world.submit(timeout_s=5 if i % 2 else None, **one_worker()) for i in range(250)]
            dispatcher = world.dispatcher()
            assert await dispatcher.admit_round() == 250
            for sub_id in world.ray.jobs:
                world.ray.jobs[sub_id] = RayJobState.RUNNING
            for _ in range(2):  # 250 jobs at 200 a round: two rounds reach every one
                await dispatcher.reconcile_round()
            assert {(await world.job(i)).status for i in ids} == {JobStatus.running}
            timed = ids[1::2]
            await world.execute(  # the odd ones have run past their 5 s
                lambda s: s.execute(
                    update(JobAttempt)
                    .where(JobAttempt.job_id.in_(timed))
                    .values(started_at=func.now() - timedelta(seconds=10))
                )
            )
            cancelled = ids[0::2]
            await world.execute(
                lambda s: s.execute(update(Job).where(Job.id.in_(cancelled)).values(status="cancelling"))
            )
            for _ in range(2):  # asked to stop: every Ray job is stopped within two rounds
                await dispatcher.reconcile_round()
            assert len(set(world.ray.stopped)) == 250
            for _ in range(2):  # and ends within two more
                await dispatcher.reconcile_round()
            final = {i: (await world.job(i)).status for i in ids}
            assert {final[i] for i in cancelled} == {JobStatus.cancelled}
            assert {final[i] for i in timed} == {JobStatus.timed_out}

    run(scenario())


def test_a_round_writes_each_admitted_gang_whole_and_marks_only_the_submissions_it_still_holds(
    database_url: str,
) -> None:
    """One round admits two gangs and writes them in one statement: each job starting under the
    lease, its pending attempt, its job token, its events in order (the storage warning, then the
    status change from queued), and a reason for the job that waits. Another dispatcher takes one job's
    lease while Ray is being called: that attempt stays pending (reconcile's to follow), the other
    is marked submitted."""
    import psycopg

    from api.db.models import ApiToken

    async def scenario() -> None:
        async with World(database_url, storage_path="/var/tm/ckpt") as world:
            two_hosts = two_host_cluster()
            world.ray.cluster = lambda: two_hosts  # type: ignore[method-assign]
            kept, taken = await world.submit(**one_worker(2)), await world.submit(**one_worker(2))
            waiting = await world.submit(**one_worker(2))
            submit = world.ray.submit

            def submit_while_another_takes_over(launch: Any) -> bool:
                if launch.metadata["trainmaster_job_id"] == str(taken):
                    url = database_url.replace("postgresql+psycopg://", "postgresql://")
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("UPDATE jobs SET lease_owner = 'd2' WHERE id = %s", (taken,))
                return submit(launch)

            world.ray.submit = submit_while_another_takes_over  # type: ignore[method-assign]
            assert await world.dispatcher("d1").admit_round() == 2

            for job_id in (kept, taken):
                job = await world.job(job_id)
                assert job.status is JobStatus.starting and job.pending_reason is None
                [attempt] = job.attempts
                assert attempt.ray_submission_id == f"tm-{job_id}-1"
                warning, status = [(e.kind, e.status, e.message, e.data) for e in await world.events(job_id)][-2:]
                assert warning[0] == "storage_warning"
                assert status == (
                    "status",
                    JobStatus.starting,
                    f"admitted; attempt 1 (tm-{job_id}-1)",
                    {"from": "queued"},
                )
                async with world.sessions() as session:
                    tokens = (await session.execute(select(ApiToken).where(ApiToken.job_id == job_id))).scalars().all()
                assert [(t.project_id, t.description) for t in tokens] == [(job.project_id, "job")]
            assert [a.status for a in await world.attempts(kept)] == ["submitted"]
            assert [a.status for a in await world.attempts(taken)] == ["pending"]  # d1 lost its lease
            left = await world.job(waiting)
            assert left.status is JobStatus.queued and "waiting for resources" in (left.pending_reason or "")

    run(scenario())


def test_a_round_never_starts_a_job_that_left_queued_after_the_claim(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round's bulk write obeys the status machine: a job cancelled between the claim and the
    write (here inside the round's own transaction, where nothing else could reach it) may not become
    starting, so it stays cancelled with no attempt, job token, event or launch; the other gang of the
    round starts as usual."""
    from api.db.models import ApiToken
    from api.queues import repository

    async def scenario() -> None:
        async with World(database_url) as world:
            kept, cancelled = await world.submit(**one_worker()), await world.submit(**one_worker())
            lock_queued = repository.lock_queued

            async def claim_then_cancel(session: Any, limit: int, cluster: Any = None, seen: Any = ()) -> list[Any]:
                claimed = await lock_queued(session, limit, cluster, seen)
                await session.execute(update(Job).where(Job.id == cancelled).values(status=JobStatus.cancelled))
                return claimed

            monkeypatch.setattr(repository, "lock_queued", claim_then_cancel)
            assert await world.dispatcher().admit_round() == 1

            assert (await world.job(kept)).status is JobStatus.starting
            assert [a.ray_submission_id for a in await world.attempts(kept)] == [f"tm-{kept}-1"]
            job = await world.job(cancelled)
            assert job.status is JobStatus.cancelled and job.attempts == [] and job.lease_owner is None
            assert [(e.kind, e.status) for e in await world.events(cancelled)] == [("status", JobStatus.queued)]
            async with world.sessions() as session:
                tokens = await session.scalar(select(func.count()).where(ApiToken.job_id == cancelled))
            assert tokens == 0
            assert list(world.ray.submit_calls) == [f"tm-{kept}-1"]

    run(scenario())


def test_a_gang_passed_by_smaller_jobs_of_its_project_holds_admission_once_starving(database_url: str) -> None:
    """Bounded waits through real rounds: the round that admits a later, smaller job of the project
    marks the waiting gang (jobs.bypassed_since); once that is `starvation_s` old, nothing after it is
    admitted until it fits, each held job saying behind which; admitted, its mark is cleared."""

    async def scenario() -> None:
        async with World(database_url, starvation_s=3600) as world:
            world.ray.cpus, world.ray.used_cpus = 4, 2
            big = await world.submit("alpha", **one_worker(cpus=3))
            small = await world.submit("alpha", **one_worker())
            assert await world.dispatcher().admit_round() == 1
            assert (await world.job(small)).status is JobStatus.starting
            passed = await world.job(big)
            assert passed.status is JobStatus.queued and passed.bypassed_since is not None
            # An hour later smaller jobs would still pass it: they wait behind it instead.
            await world.execute(
                lambda s: s.execute(
                    update(Job).where(Job.id == big).values(bypassed_since=func.now() - text("interval '2 hours'"))
                )
            )
            later = await world.submit("alpha", **one_worker())
            other = await world.submit("beta", priority=-1, **one_worker())  # after big in admission order
            world.ray.used_cpus = 3
            assert await world.dispatcher().admit_round() == 0
            starving = await world.job(big)
            assert "Later jobs of its project have passed it for 120 min" in (starving.pending_reason or "")
            for held in (later, other):
                reason = (await world.job(held)).pending_reason or ""
                assert reason.startswith(f"waiting behind job {big}, which later jobs of its project"), reason

            world.ray.used_cpus = 1  # the room it waits for
            assert await world.dispatcher().admit_round() == 1
            admitted = await world.job(big)
            assert admitted.status is JobStatus.starting and admitted.bypassed_since is None
            assert (await world.job(later)).status is JobStatus.queued

    run(scenario())
