"""Launching an attempt: its row, its job token and code, the Ray job that runs `workers.driver`."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import create_job_token, create_job_tokens
from api.code_packages import archive
from api.code_packages import repository as code_repository
from api.db.models import Job, JobAttempt
from api.dispatcher.backend import Launch, RayUnavailable
from api.jobs.status import record_event, transition_all
from api.settings import Settings
from trainmaster.context import JobContext
from trainmaster.models import AttemptStatus, JobSpec, JobStatus

if TYPE_CHECKING:
    from api.dispatcher.service import Dispatcher

log = logging.getLogger("trainmaster.dispatcher")


def submission_id(job_id: uuid.UUID, n: int) -> str:
    return f"tm-{job_id}-{n}"


async def start_attempts(
    dispatcher: Dispatcher, session: AsyncSession, admitted: Sequence[tuple[Job, JobSpec]], now: datetime
) -> list[Launch]:
    """New attempt rows for the gangs an admission round admitted (committed by the caller before any
    submit) and the launches that go with them, written together: one flush of the attempts and status
    changes, one INSERT of the job tokens, instead of several round trips per job."""
    changes: list[tuple[Job, str | None]] = []
    numbers = []
    for job, _ in admitted:
        n = max((a.n for a in job.attempts), default=0) + 1
        sub_id = submission_id(job.id, n)
        session.add(JobAttempt(job_id=job.id, n=n, ray_submission_id=sub_id, status=AttemptStatus.pending))
        job.lease_owner = dispatcher.owner
        job.lease_expires_at = now + timedelta(seconds=dispatcher.settings.lease_s)
        job.pending_reason = None
        job.infeasible_since = None
        changes.append((job, f"admitted; attempt {n} ({sub_id})"))
        numbers.append(n)
    await transition_all(session, changes, JobStatus.starting)
    tokens = await create_job_tokens(session, [(job.project_id, job.id) for job, _ in admitted])
    settings = dispatcher.settings
    return [
        build(settings, job, spec, n, token, await _working_dir(settings, session, job, spec))
        for (job, spec), n, token in zip(admitted, numbers, tokens, strict=True)
    ]


async def prepare(settings: Settings, session: AsyncSession, job: Job, spec: JobSpec, n: int) -> Launch:
    """A fresh job token and the unpacked code for one submit of attempt `n` (first or repeated)."""
    token = await create_job_token(session, job.project_id, job.id)
    working_dir = await _working_dir(settings, session, job, spec)
    return build(settings, job, spec, n, token, working_dir)


async def _working_dir(settings: Settings, session: AsyncSession, job: Job, spec: JobSpec) -> Path | None:
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


def build(settings: Settings, job: Job, spec: JobSpec, n: int, token: str, working_dir: Path | None = None) -> Launch:
    context = JobContext(
        job_id=str(job.id),
        attempt=n,
        api_url=settings.api_url,
        token=token,
        spec_json=spec.model_dump_json(),
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
    command = [sys.executable, "-m", "workers.driver", "--job-id", str(job.id), "--attempt", str(n)]
    return Launch(
        submission_id=submission_id(job.id, n),
        entrypoint=shlex.join(command),
        runtime_env=runtime_env,
        metadata={"trainmaster_job_id": str(job.id), "attempt": str(n), "name": job.name[:64]},
        entrypoint_num_cpus=settings.driver_cpus,
    )


async def submit(dispatcher: Dispatcher, launch: Launch) -> None:
    """Hand a committed attempt to Ray; a refusal leaves it pending for reconcile to submit again."""
    await submit_all(dispatcher, [launch])


async def submit_all(dispatcher: Dispatcher, launches: Sequence[Launch]) -> None:
    """Hand committed attempts to Ray one after another, then record Ray's answers in one leased
    transaction: an admission round commits once for all its launches, not once per launch. A crash
    in between leaves attempts pending, which reconcile submits again under the same id."""
    if not launches:
        return
    answers: dict[str, RayUnavailable | None] = {}
    for launch in launches:
        try:
            started = await asyncio.to_thread(dispatcher.ray.submit, launch)
        except RayUnavailable as exc:
            log.warning(
                json.dumps({"event": "submit_deferred", "submission_id": launch.submission_id, "error": str(exc)})
            )
            answers[launch.submission_id] = exc
            continue
        event = "submitted" if started else "already_submitted"
        log.info(json.dumps({"event": event, "submission_id": launch.submission_id}))
        answers[launch.submission_id] = None
    by_job = {uuid.UUID(one.metadata["trainmaster_job_id"]): one.submission_id for one in launches}
    async with dispatcher.leased_many(by_job) as held:
        for one in held:
            if one.attempt is None or one.attempt.status is not AttemptStatus.pending:
                continue
            refused = answers[one.attempt.ray_submission_id]
            if refused is None:
                one.attempt.status = AttemptStatus.submitted
                continue
            # The attempt stays pending; reconcile submits it again (same id) until launch_timeout_s.
            if one.attempt.error is None:
                await record_event(one.session, one.job, "launch_retry", f"Ray refused the launch, retrying: {refused}")
            one.attempt.error = f"Ray refused the launch: {refused}"
