"""What goes wrong with one job stays with that job: the dispatcher's rounds go on for the others.

A real PostgreSQL, Ray replaced by the exact fake of tests/factories/ray.py (the same World as
test_dispatcher.py). The real-Ray path of a bad package runs in tests/reliability/test_fault_campaign.py.
"""

from __future__ import annotations

import hashlib
import io
import uuid
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, text, update

from api.auth.repository import get_or_create_project
from api.code_packages import repository as code_repository
from api.db.models import Job, JobAttempt
from api.dispatcher.backend import LaunchRefused, RayJobState
from tests.factories.world import World, one_worker, run
from trainmaster.models import JobStatus


def zipped(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def corrupt(content: bytes, data: bytes) -> bytes:
    """The archive with one byte of a member's data flipped: its CRC no longer matches."""
    at = content.index(data)
    return content[:at] + bytes([content[at] ^ 0xFF]) + content[at + 1 :]


async def stored_code(world: World, project: str, content: bytes) -> str:
    """A package stored as it is, past the upload's checks (as a package stored before they existed)."""
    digest = f"sha256:{hashlib.sha256(content).hexdigest()}"
    async with world.sessions() as session, session.begin():
        row = await get_or_create_project(session, project)
        await code_repository.store(session, row.id, digest, content, 1)
    return digest


def world_with_cache(database_url: str, tmp_path: Path, **settings: Any) -> World:
    return World(database_url, code_cache_path=str(tmp_path / "code"), **settings)


def test_a_package_that_cannot_be_unpacked_fails_its_job_and_others_start(database_url: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with world_with_cache(database_url, tmp_path) as world:
            world.ray.cpus = 4
            payload = b"print('hello from a package whose bytes were damaged after the upload')\n" * 4
            bad = await stored_code(world, "alpha", corrupt(zipped({"train.py": payload}), payload))
            good = await stored_code(world, "beta", zipped({"train.py": b"print('ok')\n"}))
            broken = await world.submit("alpha", priority=100, code=bad, **one_worker())
            others = [
                await world.submit("beta", code=good, **one_worker()),
                await world.submit("alpha", **one_worker()),
                await world.submit("gamma", **one_worker()),
            ]
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()

            job = await world.job(broken)
            assert job.status is JobStatus.failed
            assert f"code package {bad} cannot be unpacked" in (job.error or "")
            assert "train.py" in (job.error or "")  # names the member
            [attempt] = await world.attempts(broken)
            assert attempt.status == "failed" and world.ray.submit_calls[attempt.ray_submission_id] == 0
            for job_id in others:
                assert (await world.job(job_id)).status is JobStatus.starting
            assert len(world.ray.jobs) == 3
            [sent] = [launch for launch in world.ray.launches.values() if launch.code == good]
            assert (Path(sent.runtime_env["working_dir"]) / "train.py").read_bytes() == b"print('ok')\n"

            # The next rounds do not trip on it again, and nothing of it is retried.
            await dispatcher.reconcile_round()
            await dispatcher.admit_round()
            assert (await world.job(broken)).status is JobStatus.failed
            assert len(await world.attempts(broken)) == 1

            # A later job naming the same package fails in admission with the same reason: no attempt,
            # no launch, no read of the package; the job beside it starts in the same round.
            again = await world.submit("alpha", priority=100, code=bad, **one_worker())
            beside = await world.submit("gamma", **one_worker())
            await world.execute(  # gone from the store: a read would now say "not stored"
                lambda s: s.execute(text("DELETE FROM code_packages WHERE id = :id"), {"id": bad})
            )
            await dispatcher.admit_round()
            job = await world.job(again)
            assert job.status is JobStatus.failed and job.error == (await world.job(broken)).error
            assert await world.attempts(again) == []
            assert not any(launch.code == bad for launch in world.ray.launches.values())
            assert (await world.job(beside)).status is JobStatus.starting
            [event] = [e for e in await world.events(again) if e.status is JobStatus.failed]
            assert event.message == f"not launched: {job.error}" and event.data == {"from": "queued"}

    run(scenario())


def test_what_launches_is_the_stored_package_whatever_was_left_in_its_cache_folder(
    database_url: str, tmp_path: Path
) -> None:
    """Where jobs can reach the cache (one uid for everything, a volume the Ray nodes mount), a job could
    rewrite another project's unpacked code before its next launch: each launch checks the folder."""

    async def scenario() -> None:
        async with world_with_cache(database_url, tmp_path) as world:
            world.ray.cpus = 8
            code = await stored_code(world, "beta", zipped({"train.py": b"print('ok')\n"}))

            def launched(job_id: uuid.UUID) -> dict[str, bytes]:
                [sent] = [x for x in world.ray.launches.values() if x.metadata["trainmaster_job_id"] == str(job_id)]
                folder = Path(sent.runtime_env["working_dir"])
                return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

            first = await world.submit("beta", code=code, **one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            assert launched(first) == {"train.py": b"print('ok')\n"}
            folder = tmp_path / "code" / code.removeprefix("sha256:")
            (folder / "train.py").write_bytes(b"print('another project was here')\n")
            (folder / "sitecustomize.py").write_bytes(b"print('planted')\n")

            second = await world.submit("beta", code=code, **one_worker())
            await dispatcher.admit_round()  # the same dispatcher: it knows what the folder must hold
            assert launched(second) == {"train.py": b"print('ok')\n"}

            (folder / "train.py").write_bytes(b"print('again')\n")
            third = await world.submit("beta", code=code, **one_worker())
            await world.dispatcher().admit_round()  # a new one (a restart): it checks against the store
            assert launched(third) == {"train.py": b"print('ok')\n"}

    run(scenario())


def test_a_launch_ray_calls_invalid_fails_that_job_alone(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            first = await world.submit(priority=10, **one_worker())
            second = await world.submit(**one_worker())
            world.ray.submit_errors[f"tm-{first}-1"] = LaunchRefused("Ray refused it: status code 400: bad runtime_env")
            await world.dispatcher().admit_round()
            job = await world.job(first)
            assert job.status is JobStatus.failed and "bad runtime_env" in (job.error or "")
            assert (await world.job(second)).status is JobStatus.starting
            assert f"tm-{second}-1" in world.ray.jobs

    run(scenario())


def test_a_submit_that_raises_is_retried_with_backoff_and_never_stops_the_others(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            flaky = await world.submit(priority=10, **one_worker())
            other = await world.submit(**one_worker())
            sub_id = f"tm-{flaky}-1"
            world.ray.submit_errors[sub_id] = KeyError("a bug in a client library")
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            assert f"tm-{other}-1" in world.ray.jobs  # the one after it went out
            assert (await world.job(flaky)).status is JobStatus.starting
            [attempt] = await world.attempts(flaky)
            assert attempt.status == "pending" and "KeyError" in (attempt.error or "")
            assert "launch_retry" in [e.kind for e in await world.events(flaky)]

            await dispatcher.reconcile_round()  # within the backoff: not sent again
            assert world.ray.submit_calls[sub_id] == 1
            del world.ray.submit_errors[sub_id]
            dispatcher.backoff.delays[sub_id] = (0.0, 1.0)  # the backoff has passed
            await dispatcher.reconcile_round()
            assert world.ray.submit_calls[sub_id] == 2 and sub_id in world.ray.jobs

    run(scenario())


def test_a_job_whose_admission_raises_fails_and_the_round_admits_the_rest(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            bad = await world.submit(priority=10, **one_worker())
            good = await world.submit(**one_worker())
            await world.execute(  # a stored spec that placement cannot read (written by an old version)
                lambda s: s.execute(
                    text(
                        """UPDATE jobs SET spec = jsonb_set(spec, '{scaling,num_workers}', '"many"') WHERE id = :id"""
                    ),
                    {"id": bad},
                )
            )
            assert await world.dispatcher().admit_round() == 1
            job = await world.job(bad)
            assert job.status is JobStatus.failed and "could not be placed" in (job.error or "")
            assert (await world.job(good)).status is JobStatus.starting

    run(scenario())


def test_a_job_whose_reconcile_keeps_raising_fails_after_the_limit_and_others_go_on(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, reconcile_error_limit=3) as world:
            bad, good = [await world.submit(**one_worker()) for _ in range(2)]
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            for sub_id in world.ray.jobs:
                world.ray.jobs[sub_id] = RayJobState.RUNNING
            original = world.ray.info

            def info(submission_id: str) -> Any:
                if submission_id == f"tm-{bad}-1":
                    raise ZeroDivisionError("a bug while reading this job")
                return original(submission_id)

            world.ray.info = info  # type: ignore[method-assign]
            for _ in range(2):
                await dispatcher.reconcile_round()
            assert (await world.job(good)).status is JobStatus.running
            assert (await world.job(bad)).status is JobStatus.starting  # tried again next round
            await dispatcher.reconcile_round()  # the third round in a row
            job = await world.job(bad)
            assert job.status is JobStatus.failed and "ZeroDivisionError" in (job.error or "")
            assert f"tm-{bad}-1" in world.ray.stopped

    run(scenario())


async def age_attempt(world: World, job_id: uuid.UUID, seconds: float) -> None:
    await world.execute(
        lambda s: s.execute(
            update(JobAttempt)
            .where(JobAttempt.job_id == job_id)
            .values(created_at=func.now() - timedelta(seconds=seconds))
        )
    )


def test_a_lost_workers_started_report_is_settled_by_asking_ray_past_the_bound(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url, api_url="http://api:8000", starting_timeout_s=60) as world:
            world.ray.cpus = 4
            placed, unplaced = [await world.submit(max_retries=0, **one_worker()) for _ in range(2)]
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            for sub_id in world.ray.jobs:
                world.ray.jobs[sub_id] = RayJobState.RUNNING  # drivers run; no workers_started arrives
            world.ray.placed.add(f"tm-{placed}-1")
            await dispatcher.reconcile_round()
            assert (await world.job(placed)).status is JobStatus.starting  # within the bound: waits

            for job_id in (placed, unplaced):
                await age_attempt(world, job_id, 61)
            await dispatcher.reconcile_round()
            job = await world.job(placed)
            assert job.status is JobStatus.running and job.pending_reason is None
            job = await world.job(unplaced)
            assert job.status is JobStatus.failed and "not placed within starting_timeout_s" in (job.error or "")
            assert world.ray.stopped == [f"tm-{unplaced}-1"]

    run(scenario())


def test_a_gang_ray_leaves_pending_goes_back_to_the_queue_with_rays_reason(database_url: str) -> None:
    """Admission's book said it fits; Ray holds its placement group PENDING past placement_timeout_s:
    the Ray job is stopped and the job is queued again (not a retry), with Ray's words; a gang that
    Ray keeps refusing fails after PLACEMENT_REQUEUES. A gang Ray placed is left alone."""

    async def scenario() -> None:
        async with World(database_url, api_url="http://api:8000", placement_timeout_s=30) as world:
            world.ray.cpus = 4
            stuck, placed = [await world.submit(max_retries=0, **one_worker()) for _ in range(2)]
            dispatcher = world.dispatcher()
            for n in range(1, 6):
                await dispatcher.admit_round()
                sub_id = f"tm-{stuck}-{n}"
                world.ray.jobs[sub_id] = RayJobState.RUNNING
                world.ray.jobs[f"tm-{placed}-1"] = RayJobState.RUNNING
                world.ray.pending[sub_id] = "Ray: NO_RESOURCES, 12 scheduling attempt(s)"
                world.ray.placed.add(f"tm-{placed}-1")
                await dispatcher.reconcile_round()
                assert (await world.job(stuck)).status is JobStatus.starting  # within the bound: waits
                for job_id in (stuck, placed):
                    await age_attempt(world, job_id, 31)
                await dispatcher.reconcile_round()
                job = await world.job(stuck)
                if n <= 3:
                    assert job.status is JobStatus.queued, (n, job.status, job.error)
                    assert job.pending_reason == (
                        "Ray left its gang pending (Ray: NO_RESOURCES, 12 scheduling attempt(s)); "
                        "queued again, waiting for room"
                    )
                    assert world.ray.stopped[-1] == sub_id
                    continue
                assert job.status is JobStatus.failed, (n, job.status)
                assert "back in the queue 3 times already" in (job.error or "")
                break
            attempts = await world.attempts(stuck)
            assert [a.status for a in attempts] == ["stopped", "stopped", "stopped", "failed"]
            assert all("gang not placed by Ray within" in (a.error or "") for a in attempts)
            requeued = [e for e in await world.events(stuck) if e.data.get("requeued") == "unplaced"]
            assert len(requeued) == 3 and all(e.status is JobStatus.queued for e in requeued)
            assert "not a retry" in (requeued[0].message or "")
            assert (await world.job(placed)).status is JobStatus.starting  # placed: waits for its report
            assert f"tm-{placed}-1" not in world.ray.stopped

    run(scenario())


def test_a_job_that_succeeded_within_its_limit_is_not_timed_out_when_seen_late(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(timeout_s=30, **one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            sub_id = f"tm-{job_id}-1"
            world.ray.jobs[sub_id] = RayJobState.RUNNING
            await dispatcher.reconcile_round()
            [attempt] = await world.attempts(job_id)
            assert attempt.started_at is not None
            # It ended 20 s after it started; the dispatcher looks again 40 s after the start.
            await world.execute(
                lambda s: s.execute(
                    update(JobAttempt)
                    .where(JobAttempt.job_id == job_id)
                    .values(started_at=func.now() - timedelta(seconds=40))
                )
            )
            [attempt] = await world.attempts(job_id)
            world.ray.jobs[sub_id] = RayJobState.SUCCEEDED
            world.ray.end_times[sub_id] = attempt.started_at + timedelta(seconds=20)
            await dispatcher.reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.succeeded
            assert world.ray.stopped == []

    run(scenario())


def test_a_final_log_read_that_fails_is_retried_then_recorded(database_url: str) -> None:
    async def scenario() -> None:
        async with World(database_url) as world:
            job_id = await world.submit(**one_worker())
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            sub_id = f"tm-{job_id}-1"
            world.ray.jobs[sub_id] = RayJobState.SUCCEEDED
            world.ray.outputs[sub_id] = "epoch 1\nthe last line\n"
            world.ray.final_logs_down = True
            await dispatcher.reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.starting  # waits for its logs

            world.ray.final_logs_down = False
            dispatcher.backoff.forget(f"logs:{sub_id}")
            await dispatcher.reconcile_round()
            assert (await world.job(job_id)).status is JobStatus.succeeded
            assert "logs_incomplete" not in [e.kind for e in await world.events(job_id)]

            # Ray never gives them: the job ends after the wait, saying where its log stops.
            other = await world.submit(**one_worker())
            await dispatcher.admit_round()
            other_sub = f"tm-{other}-1"
            world.ray.jobs[other_sub] = RayJobState.SUCCEEDED
            world.ray.final_logs_down = True
            dispatcher.backoff.delays[f"logs:{other_sub}"] = (0.0, 60.0)  # it has waited long enough
            await dispatcher.reconcile_round()
            job = await world.job(other)
            assert job.status is JobStatus.succeeded
            [event] = [e for e in await world.events(other) if e.kind == "logs_incomplete"]
            assert "could not be read from Ray" in (event.message or "")

    run(scenario())


def test_launches_that_can_never_be_made_end_in_one_write_that_keeps_the_status_rules(database_url: str) -> None:
    """round_writes.FAIL_LAUNCHES: a job being cancelled ends cancelled, a job another dispatcher took
    over is left alone, the rest fail with the reason, an event, no lease and no live job token."""
    from api.dispatcher import launch

    async def scenario() -> None:
        async with World(database_url) as world:
            world.ray.cpus = 4
            plain, cancelling, taken = [await world.submit(**one_worker()) for _ in range(3)]
            world.ray.refuse_submit = True  # Ray busy: every attempt stays pending
            dispatcher = world.dispatcher()
            await dispatcher.admit_round()
            await world.execute(
                lambda s: s.execute(
                    update(Job).where(Job.id == cancelling).values(status="cancelling", cancel_requested=True)
                )
            )
            await world.execute(lambda s: s.execute(update(Job).where(Job.id == taken).values(lease_owner="d2")))
            refusals = [
                launch.refused(await world.job(job_id), 1, "code package sha256:00 cannot be unpacked: x: bad")
                for job_id in (plain, cancelling, taken)
            ]
            await launch.submit_all(dispatcher, refusals)

            job = await world.job(plain)
            assert job.status is JobStatus.failed and job.lease_owner is None
            assert job.error == "code package sha256:00 cannot be unpacked: x: bad"
            [attempt] = await world.attempts(plain)
            assert attempt.status == "failed" and attempt.finished_at is not None
            [event] = [e for e in await world.events(plain) if e.status is JobStatus.failed]
            assert event.message == f"attempt 1 could not be launched: {job.error}"
            assert event.data == {"from": "starting"}
            assert (await world.job(cancelling)).status is JobStatus.cancelled
            assert (await world.job(taken)).status is JobStatus.starting  # not ours to end
            live = text("SELECT count(*) FROM api_tokens WHERE job_id = :id AND revoked_at IS NULL")
            async with world.sessions() as session:
                assert (await session.execute(live, {"id": plain})).scalar_one() == 0
                assert (await session.execute(live, {"id": taken})).scalar_one() == 1

    run(scenario())
