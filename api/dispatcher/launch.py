"""Launching an attempt: its row, its job token and code, the Ray job that runs `workers.driver`
(through `workers.warm`, which forks it warm where it can)."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import create_job_token, hash_token, new_token
from api.code_packages import archive
from api.code_packages import repository as code_repository
from api.db.models import Job
from api.dispatcher import round_writes
from api.dispatcher.backend import Launch, LaunchRefused, RayBackend, RayUnavailable
from api.dispatcher.context import RoundContext
from api.jobs.status import JOB_CHANNEL, record_event
from api.queues.repository import QueuedJob
from api.settings import Settings
from trainmaster.context import ENV_ELASTIC_RESIZE_S, ENV_LABEL_SELECTOR, JobContext, project_storage
from trainmaster.models import AttemptStatus, JobSpec

log = logging.getLogger("trainmaster.dispatcher")


def submission_id(job_id: uuid.UUID, n: int) -> str:
    return f"tm-{job_id}-{n}"


class JobRef(Protocol):
    """What a launch needs of its job: an ORM Job (reconcile) or a queued row (admission)."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def project_id(self) -> uuid.UUID: ...

    @property
    def name(self) -> str: ...


async def start_attempts(
    context: RoundContext,
    session: AsyncSession,
    admitted: Sequence[QueuedJob],
    now: datetime,
    warning: str | None = None,
    reasons: Mapping[uuid.UUID, str] | None = None,
    failures: Mapping[uuid.UUID, tuple[str, str]] | None = None,
    selectors: Mapping[uuid.UUID, dict[str, str]] | None = None,
    bypassed: Sequence[uuid.UUID] = (),
) -> list[Launch]:
    """New attempt rows for the gangs an admission round admitted (committed by the caller before any
    submit) and the launches that go with them. Each job's status change to starting, attempt, events
    (the round's storage `warning` first) and job token, the waiting jobs' new `reasons`, and every
    NOTIFY, the jobs that fail before a launch (`failures`: job id -> (error, event message)), are one
    statement for the whole round (round_writes.ROUND_WRITES). It moves only the jobs
    the status machine lets become starting; one that may not (it left `queued` after the claim) gets
    nothing and is not launched, and the round goes on with the others. Nothing here reads or unpacks
    code (that waits for the commit: `submit_all`), and a launch that cannot be built is returned
    refused, for `submit_all` to fail its job alone. `selectors`: the node-label domain each gang with
    a topology was placed inside; `bypassed`: the waiting jobs a later job of their project passed."""
    settings = context.settings
    selectors = selectors or {}
    claims = [new_token() for _ in admitted]  # each job token row is written with its claim's hash
    gangs = [
        round_writes.AdmittedGang(
            job,
            job.attempts + 1,
            submission_id(job.id, job.attempts + 1),
            hash_token(claim),
            f"admitted; attempt {job.attempts + 1} ({submission_id(job.id, job.attempts + 1)})"
            + "".join(f" inside {key}={value}" for key, value in (selectors.get(job.id) or {}).items()),
            selectors.get(job.id),
        )
        for job, claim in zip(admitted, claims, strict=True)
    ]
    started = await round_writes.write_round(
        session,
        gangs=gangs,
        warning=warning,
        reasons=reasons,
        failures=failures,
        bypassed=bypassed,
        owner=context.owner,
        lease_expires_at=now + timedelta(seconds=settings.lease_s),
        channel=JOB_CHANNEL,
    )
    launches = []
    for gang, claim in zip(gangs, claims, strict=True):
        if gang.job.id not in started:
            log.warning("start_refused", extra={"job_id": str(gang.job.id), "reason": "not queued"})
            continue
        try:
            spec = LaunchSpec.stored(gang.job.spec)
            launches.append(build(settings, gang.job, spec, gang.n, claim, gang.selector))
        except Exception as exc:  # this job's spec, or a bug: its job fails, the round goes on
            log.exception("build_failed", extra={"job_id": str(gang.job.id)})
            launches.append(refused(gang.job, gang.n, f"the launch could not be built: {type(exc).__name__}: {exc}"))
    return launches


async def prepare(
    settings: Settings, session: AsyncSession, job: Job, spec: JobSpec, n: int, selector: dict[str, str] | None
) -> Launch:
    """A fresh job token claim for one submit of attempt `n` (first or repeated; `selector`, the domain
    it was admitted into); the code is unpacked by `submit_all`, outside the caller's transaction."""
    claim = await create_job_token(session, job.project_id, job.id, n)
    return build(settings, job, spec, n, claim, selector)


def refused(job: JobRef, n: int, why: str) -> Launch:
    """A launch of attempt `n` that is never sent: `submit_all` fails its job with `why`."""
    return Launch(
        submission_id=submission_id(job.id, n),
        entrypoint="",
        metadata={"trainmaster_job_id": str(job.id), "attempt": str(n)},
        refusal=why,
    )


@dataclass(frozen=True)
class LaunchSpec:
    """What a launch reads of a job's spec."""

    spec_json: str
    env: Mapping[str, str]
    pip: Sequence[str]
    code: str | None

    @classmethod
    def of(cls, spec: JobSpec) -> LaunchSpec:
        return cls(spec.model_dump_json(), spec.env, spec.pip, spec.code)

    @classmethod
    def stored(cls, spec: Mapping[str, Any]) -> LaunchSpec:
        """From the spec as the jobs table holds it (JobSpec.model_dump, validated when it was
        submitted; the driver validates it again): no model built, about 65 µs a job less, which an
        admission round of 50 gangs notices."""
        return cls(json.dumps(spec), spec.get("env") or {}, spec.get("pip") or [], spec.get("code"))


async def with_code(context: RoundContext, launch: Launch) -> Launch:
    """`launch` with its code package unpacked and set as its working directory; Ray uploads it to
    the cluster. Unpacked once per package into a content-addressed folder (archive.unpacked). The
    folder is trusted only as far as its files' digest (archive.tree_digest) equals what this process
    learnt from the store: a package already there costs hashing its files (as Ray's upload does), not
    a read of the database; a folder changed since (a job on a host that shares the cache, a crash)
    or not yet checked by this process is checked against the store, and unpacked again if it
    differs. Raises archive.BadPackage when the package can never be used (not stored, or refused by
    the checks); anything else (a full disk, the database) may pass."""
    if launch.code is None:
        return launch
    if (known := context.bad_code.get(launch.code)) is not None:
        raise archive.BadPackage(known)
    settings = context.settings
    cache = Path(settings.code_cache_path).expanduser()
    folder = cache / launch.code.removeprefix("sha256:")
    expected = context.code_trees.get(launch.code)
    if expected is not None and folder.is_dir() and await asyncio.to_thread(archive.tree_digest, folder) == expected:
        return replace(launch, runtime_env={**launch.runtime_env, "working_dir": str(folder)})
    async with context.sessions() as session:
        content = await code_repository.content(session, uuid.UUID(launch.project_id), launch.code)
    if content is None:  # this project's alone (another may hold the same digest): not remembered
        raise archive.BadPackage(f"code package {launch.code} is not stored for this job's project: upload it")
    files, size = settings.max_code_files, settings.max_code_unpacked_bytes
    try:
        folder = await asyncio.to_thread(
            archive.unpacked, cache, launch.code, content, max_files=files, max_unpacked_bytes=size
        )
        tree = await asyncio.to_thread(archive.members_digest, content, files, size)
    except archive.BadPackage as exc:
        context.remember_bad_code(launch.code, str(exc))  # its next jobs fail in admission, unlaunched
        raise
    context.remember_code_tree(launch.code, tree)
    return replace(launch, runtime_env={**launch.runtime_env, "working_dir": str(folder)})


def build(
    settings: Settings,
    job: JobRef,
    spec: JobSpec | LaunchSpec,
    n: int,
    claim: str,
    selector: dict[str, str] | None = None,
) -> Launch:
    """Attempt `n`'s launch. It carries the claim of its job token, never the token: every job on the
    cluster can read a launch through Ray's Jobs API, and the driver exchanges the claim once
    (JobContext.claimed). The claim is in the Ray job's metadata, never its runtime_env, whose variables
    Ray writes into its worker processes' command lines, which every local user can read.
    `selector`: the node-label domain its workers must stay inside."""
    if isinstance(spec, JobSpec):
        spec = LaunchSpec.of(spec)
    context = JobContext(
        job_id=str(job.id),
        attempt=n,
        api_url=settings.api_url,
        claim=claim,
        spec_json=spec.spec_json,
        storage_path=project_storage(settings.storage_path, str(job.project_id)),  # runs never share a tree
        collective_timeout_s=settings.collective_timeout_s,
        system_metrics_interval_s=settings.system_metrics_interval_s,
        extra_env=spec.env,
    )
    env = {
        **context.to_env(),
        "RAY_CHDIR_TO_TRIAL_DIR": "0",  # workers run in the job's working directory
        "RAY_DEDUP_LOGS": "0",  # every rank's line is stored: Ray would fold lines that differ in numbers
        ENV_ELASTIC_RESIZE_S: f"{settings.elastic_resize_interval_s:g}",
    }
    if selector:
        env[ENV_LABEL_SELECTOR] = json.dumps(selector)
    runtime_env: dict[str, object] = {"env_vars": env}
    if spec.pip:
        runtime_env["pip"] = list(spec.pip)
    driver = "workers.warm" if settings.warm_driver else "workers.driver"  # the same arguments
    command = [sys.executable, "-m", driver, "--job-id", str(job.id), "--attempt", str(n)]
    return Launch(
        submission_id=submission_id(job.id, n),
        entrypoint=shlex.join(command),
        runtime_env=runtime_env,
        metadata={
            "trainmaster_job_id": str(job.id),
            "attempt": str(n),
            "name": job.name[:64],
            **context.launch_metadata(),
        },
        entrypoint_num_cpus=settings.driver_cpus,
        code=spec.code,
        project_id=str(job.project_id),
    )


async def submit(context: RoundContext, launch: Launch) -> None:
    """Hand a committed attempt to Ray; a refusal leaves it pending for reconcile to submit again."""
    await submit_all(context, [launch])


async def submit_all(context: RoundContext, launches: Sequence[Launch]) -> None:
    """Hand committed attempts to Ray one after another (one worker thread for them all), then
    record the answers. Each launch is on its own: its code is unpacked (`with_code`) and Ray asked,
    and whatever goes wrong is that job's alone.
    - accepted: marked submitted in one statement under the lease check (round_writes.mark_submitted);
    - refused for good (its code package, Ray calls it invalid): the attempt and the job fail with
      the reason, in one statement beside the accepted ones' (round_writes.fail_launches);
    - refused for now (Ray busy or unreachable, the disk, a bug): the attempt stays pending and
      reconcile submits it again under the same id, after a backoff, until launch_timeout_s.
    An admission round commits once for all its launches, not once per launch. A crash in between
    leaves attempts pending, which reconcile submits again under the same id."""
    if not launches:
        return
    ready: list[Launch] = []
    outcomes: dict[str, LaunchResult] = {}
    for launch in launches:
        if launch.refusal is not None:
            outcomes[launch.submission_id] = LaunchResult(launch, error=launch.refusal, permanent=True)
            continue
        try:
            ready.append(await with_code(context, launch))
        except archive.BadPackage as exc:
            outcomes[launch.submission_id] = LaunchResult(launch, error=str(exc), permanent=True)
        except Exception as exc:
            log.exception("code_failed", extra=launch.log_fields)
            error = f"unpacking its code failed, retrying: {_short(exc)}"
            outcomes[launch.submission_id] = LaunchResult(launch, error=error)
    if ready:
        outcomes.update(await asyncio.to_thread(_submit_each, context.ray, ready))
    accepted = {o.job_id: o.launch.submission_id for o in outcomes.values() if o.error is None}
    permanent = {o.job_id: o for o in outcomes.values() if o.error is not None and o.permanent}
    for outcome in outcomes.values():
        if outcome.error is None or outcome.permanent:
            context.backoff.forget(outcome.launch.submission_id)
    for job_id, outcome in permanent.items():
        log.warning("launch_failed", extra={"job_id": str(job_id), "error": str(outcome.error)[:300]})
    if accepted or permanent:
        async with context.sessions() as session:
            # Each statement is its own transaction: no BEGIN and COMMIT round trips around them.
            await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            if accepted:
                await round_writes.mark_submitted(session, accepted, context.owner)
            if permanent:  # their jobs end, in one statement (round_writes.FAIL_LAUNCHES)
                failures = {job_id: (o.launch.submission_id, str(o.error)) for job_id, o in permanent.items()}
                await round_writes.fail_launches(session, failures, context.owner, JOB_CHANNEL)
    passing = {o.job_id: o for o in outcomes.values() if o.error is not None and not o.permanent}
    if passing:
        await _retry_later(context, passing)


@dataclass(frozen=True)
class LaunchResult:
    """What became of one launch: sent (no error), or why not, and whether trying again can help."""

    launch: Launch
    error: str | None = None
    permanent: bool = False

    @property
    def job_id(self) -> uuid.UUID:
        return uuid.UUID(self.launch.metadata["trainmaster_job_id"])


async def _retry_later(context: RoundContext, passing: Mapping[uuid.UUID, LaunchResult]) -> None:
    """Launches that failed for a passing reason: the attempt stays pending with the error (an event
    the first time) and a backoff before the next try, in one leased transaction."""
    async with context.leased_many({job_id: o.launch.submission_id for job_id, o in passing.items()}) as held:
        for one in held:
            outcome = passing[one.job.id]
            if one.attempt is None or one.attempt.status is not AttemptStatus.pending or outcome.error is None:
                continue
            delay = context.backoff.defer(outcome.launch.submission_id)
            if one.attempt.error is None:
                await record_event(
                    one.session, one.job, "launch_retry", f"{outcome.error}; trying again in {delay:.0f} s"
                )
            one.attempt.error = outcome.error


def _submit_each(ray: RayBackend, launches: Sequence[Launch]) -> dict[str, LaunchResult]:
    """Ray's answer to each launch, each on its own: one that raises never keeps the next from Ray."""
    answers: dict[str, LaunchResult] = {}
    for launch in launches:
        try:
            started = ray.submit(launch)
        except LaunchRefused as exc:
            answers[launch.submission_id] = LaunchResult(launch, error=str(exc), permanent=True)
            continue
        except RayUnavailable as exc:
            log.warning("submit_deferred", extra={**launch.log_fields, "error": str(exc)})
            answers[launch.submission_id] = LaunchResult(launch, error=f"Ray refused the launch: {exc}")
            continue
        except Exception as exc:  # a bug, ours or Ray's client's: retried within launch_timeout_s
            log.exception("submit_failed", extra=launch.log_fields)
            answers[launch.submission_id] = LaunchResult(launch, error=f"submitting it raised {_short(exc)}")
            continue
        log.info("job_launched" if started else "job_already_launched", extra=launch.log_fields)
        answers[launch.submission_id] = LaunchResult(launch)
    return answers


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
