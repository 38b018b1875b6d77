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
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import create_job_token, hash_token, new_token
from api.code_packages import archive
from api.code_packages import repository as code_repository
from api.db.models import Job
from api.dispatcher import repository as repo
from api.dispatcher.backend import Launch, RayBackend, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.repository import QueuedJob
from api.jobs.status import JOB_CHANNEL, record_event
from api.settings import Settings
from trainmaster.context import JobContext
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
) -> list[Launch]:
    """New attempt rows for the gangs an admission round admitted (committed by the caller before any
    submit) and the launches that go with them. Each job's status change to starting, attempt, events
    (the round's storage `warning` first) and job token, the waiting jobs' new `reasons`, and every
    NOTIFY, are one statement for the whole round (repository.ROUND_WRITES). It moves only the jobs
    the status machine lets become starting; one that may not (it left `queued` after the claim) gets
    nothing and is not launched, and the round goes on with the others."""
    settings = context.settings
    tokens = [new_token() for _ in admitted]
    gangs = [
        repo.Gang(
            job,
            job.attempts + 1,
            submission_id(job.id, job.attempts + 1),
            hash_token(token),
            f"admitted; attempt {job.attempts + 1} ({submission_id(job.id, job.attempts + 1)})",
        )
        for job, token in zip(admitted, tokens, strict=True)
    ]
    started = await repo.write_round(
        session,
        gangs=gangs,
        warning=warning,
        reasons=reasons,
        owner=context.owner,
        lease_expires_at=now + timedelta(seconds=settings.lease_s),
        channel=JOB_CHANNEL,
    )
    launches = []
    for gang, token in zip(gangs, tokens, strict=True):
        if gang.job.id not in started:
            log.warning(json.dumps({"event": "start_refused", "job_id": str(gang.job.id), "reason": "not queued"}))
            continue
        spec = LaunchSpec.stored(gang.job.spec)
        working_dir = await _working_dir(settings, session, gang.job, spec)
        launches.append(build(settings, gang.job, spec, gang.n, token, working_dir))
    return launches


async def prepare(settings: Settings, session: AsyncSession, job: Job, spec: JobSpec, n: int) -> Launch:
    """A fresh job token and the unpacked code for one submit of attempt `n` (first or repeated)."""
    token = await create_job_token(session, job.project_id, job.id)
    working_dir = await _working_dir(settings, session, job, spec)
    return build(settings, job, spec, n, token, working_dir)


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


async def _working_dir(
    settings: Settings, session: AsyncSession, job: JobRef, spec: JobSpec | LaunchSpec
) -> Path | None:
    """The job's uploaded code, unpacked once per archive; Ray uploads it to the cluster."""
    if spec.code is None:
        return None
    content = await code_repository.content(session, job.project_id, spec.code)
    if content is None:
        raise LookupError(f"code {spec.code} of job {job.id} is gone")
    folder = Path(settings.code_cache_path).expanduser() / spec.code.removeprefix("sha256:")
    return await asyncio.to_thread(
        archive.extract,
        content,
        folder,
        max_files=settings.max_code_files,
        max_unpacked_bytes=settings.max_code_unpacked_bytes,
    )


def build(
    settings: Settings, job: JobRef, spec: JobSpec | LaunchSpec, n: int, token: str, working_dir: Path | None = None
) -> Launch:
    if isinstance(spec, JobSpec):
        spec = LaunchSpec.of(spec)
    context = JobContext(
        job_id=str(job.id),
        attempt=n,
        api_url=settings.api_url,
        token=token,
        spec_json=spec.spec_json,
        storage_path=settings.storage_path,
        collective_timeout_s=settings.collective_timeout_s,
        system_metrics_interval_s=settings.system_metrics_interval_s,
        extra_env=spec.env,
    )
    env = {
        **context.to_env(),
        "RAY_CHDIR_TO_TRIAL_DIR": "0",  # workers run in the job's working directory
        "RAY_DEDUP_LOGS": "0",  # every rank's line is stored: Ray would fold lines that differ in numbers
    }
    runtime_env: dict[str, object] = {"env_vars": env}
    if working_dir is not None:
        runtime_env["working_dir"] = str(working_dir)
    if spec.pip:
        runtime_env["pip"] = list(spec.pip)
    driver = "workers.warm" if settings.warm_driver else "workers.driver"  # the same arguments
    command = [sys.executable, "-m", driver, "--job-id", str(job.id), "--attempt", str(n)]
    return Launch(
        submission_id=submission_id(job.id, n),
        entrypoint=shlex.join(command),
        runtime_env=runtime_env,
        metadata={"trainmaster_job_id": str(job.id), "attempt": str(n), "name": job.name[:64]},
        entrypoint_num_cpus=settings.driver_cpus,
    )


async def submit(context: RoundContext, launch: Launch) -> None:
    """Hand a committed attempt to Ray; a refusal leaves it pending for reconcile to submit again."""
    await submit_all(context, [launch])


async def submit_all(context: RoundContext, launches: Sequence[Launch]) -> None:
    """Hand committed attempts to Ray one after another (one worker thread for them all), then
    record Ray's answers: the accepted ones in one statement under the lease check
    (repository.mark_submitted), the refused ones in one leased transaction. An admission round
    commits once for all its launches, not once per launch. A crash in between leaves attempts
    pending, which reconcile submits again under the same id."""
    if not launches:
        return
    answers = await asyncio.to_thread(_submit_each, context.ray, launches)
    accepted: dict[uuid.UUID, str] = {}
    refused: dict[uuid.UUID, str] = {}
    for sent in launches:
        job_id = uuid.UUID(sent.metadata["trainmaster_job_id"])
        (refused if answers[sent.submission_id] else accepted)[job_id] = sent.submission_id
    if accepted:
        async with context.sessions() as session:
            # One statement is its own transaction: no BEGIN and COMMIT round trips around it.
            await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            await repo.mark_submitted(session, accepted, context.owner)
    if not refused:
        return
    async with context.leased_many(refused) as held:
        for one in held:
            if one.attempt is None or one.attempt.status is not AttemptStatus.pending:
                continue
            # The attempt stays pending; reconcile submits it again (same id) until launch_timeout_s.
            error = answers[one.attempt.ray_submission_id]
            if one.attempt.error is None:
                await record_event(one.session, one.job, "launch_retry", f"Ray refused the launch, retrying: {error}")
            one.attempt.error = f"Ray refused the launch: {error}"


def _submit_each(ray: RayBackend, launches: Sequence[Launch]) -> dict[str, RayUnavailable | None]:
    """Ray's answer to each launch: None when it took it (now or before), else why it could not."""
    answers: dict[str, RayUnavailable | None] = {}
    for launch in launches:
        try:
            started = ray.submit(launch)
        except RayUnavailable as exc:
            log.warning(
                json.dumps({"event": "submit_deferred", "submission_id": launch.submission_id, "error": str(exc)})
            )
            answers[launch.submission_id] = exc
            continue
        if log.isEnabledFor(logging.INFO):
            event = "submitted" if started else "already_submitted"
            log.info(json.dumps({"event": event, "submission_id": launch.submission_id}))
        answers[launch.submission_id] = None
    return answers
