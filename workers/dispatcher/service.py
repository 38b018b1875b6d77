"""The dispatcher's decisions: admit queued gangs, launch attempts, follow them to the end.

Safety rules, each relied on by the tests:
- An attempt row with its Ray submission id is committed before Ray hears of it. Ray refuses a
  second submission with the same id, so a retried or repeated submit never launches twice.
- Every write after a claim goes through `lock_if_leased`: a dispatcher that lost its lease (it
  stalled and another took over) changes nothing.
- An attempt Ray no longer knows (the cluster restarted) is lost, never resubmitted: a retry is a
  new attempt with a new id, and it resumes from the run's latest checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.auth.service import create_job_token
from api.code_packages import archive
from api.code_packages import repository as code_repository
from api.db.models import Job, JobAttempt
from api.jobs.status import record_event, transition
from api.logs import repository as logs_repository
from api.settings import Settings
from trainmaster.models import JobSpec, JobStatus
from workers.collectives.timeout import ENV_COLLECTIVE_TIMEOUT_S
from workers.dispatcher import repository as repo
from workers.dispatcher.admission import Decision, admit
from workers.dispatcher.backend import Launch, RayBackend, RayJobInfo, RayJobState, RayUnavailable
from workers.dispatcher.faults import maybe_die
from workers.runtime import (
    ENV_API_URL,
    ENV_ATTEMPT,
    ENV_JOB_ID,
    ENV_JOB_SPEC,
    ENV_JOB_TOKEN,
    ENV_STORAGE_PATH,
)

log = logging.getLogger("trainmaster.dispatcher")

# Attempt statuses (strings in job_attempts.status).
PENDING, SUBMITTED, RUNNING = "pending", "submitted", "running"
SUCCEEDED, FAILED, LOST, STOPPED, TIMING_OUT, TIMED_OUT = (
    "succeeded",
    "failed",
    "lost",
    "stopped",
    "timing_out",
    "timed_out",
)


def submission_id(job_id: uuid.UUID, n: int) -> str:
    return f"tm-{job_id}-{n}"


@dataclass
class Dispatcher:
    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    ray: RayBackend
    owner: str
    ray_down_since: datetime | None = None

    # -- admission ------------------------------------------------------------------------------

    async def admit_round(self) -> int:
        """Admit what fits now; give everything else a reason. Returns how many were launched."""
        try:
            cluster = await asyncio.to_thread(self.ray.cluster)
        except RayUnavailable as exc:
            await self._set_reasons_unreachable(str(exc))
            return 0
        driver = {"CPU": self.settings.driver_cpus} if self.settings.driver_cpus > 0 else {}
        launches: list[Launch] = []
        async with self.sessions() as session, session.begin():
            held_cpus, held_gpus = await repo.held_resources(session)
            total = cluster.total()
            budget = {"CPU": total.get("CPU", 0.0) - held_cpus, "GPU": total.get("GPU", 0.0) - held_gpus}
            for job in await repo.lock_queued(session, self.settings.admit_batch):
                spec = JobSpec.model_validate(job.spec)
                admission = admit(spec, cluster, driver)
                if admission.decision is Decision.admit and not _within(budget, job):
                    admission.decision = Decision.wait
                    admission.reason = (
                        f"waiting for resources: trainmaster jobs that are starting hold {held_cpus:g} CPU "
                        f"and {held_gpus:g} GPU of the cluster's {total.get('CPU', 0):g} CPU / "
                        f"{total.get('GPU', 0):g} GPU"
                    )
                if admission.decision is Decision.admit:
                    cluster.reserve(admission.placement)
                    budget["CPU"] -= job.gang_cpus
                    budget["GPU"] -= job.gang_gpus
                    launches.append(await self._start_attempt(session, job, spec))
                elif admission.decision is Decision.wait:
                    job.infeasible_since = None
                    job.pending_reason = admission.reason
                else:
                    await self._infeasible(session, job, admission.reason)
        if launches:
            maybe_die("after_claim")  # the attempt rows are committed; Ray has heard of nothing
        for launch in launches:
            await self._submit(launch)
        return len(launches)

    async def _start_attempt(self, session: AsyncSession, job: Job, spec: JobSpec) -> Launch:
        n = max((a.n for a in job.attempts), default=0) + 1
        sub_id = submission_id(job.id, n)
        session.add(JobAttempt(job_id=job.id, n=n, ray_submission_id=sub_id, status=PENDING))
        job.lease_owner = self.owner
        job.lease_expires_at = repo.now() + timedelta(seconds=self.settings.lease_s)
        job.pending_reason = None
        job.infeasible_since = None
        await transition(session, job, JobStatus.starting, message=f"admitted; attempt {n} ({sub_id})")
        return await self._prepare_launch(session, job, spec, n, sub_id)

    async def _prepare_launch(self, session: AsyncSession, job: Job, spec: JobSpec, n: int, sub_id: str) -> Launch:
        """A fresh job token and the unpacked code for one submit of attempt `n` (first or repeated)."""
        token = await create_job_token(session, job.project_id, job.id)
        return self._launch(job, spec, n, sub_id, token, await self._working_dir(session, job, spec))

    async def _working_dir(self, session: AsyncSession, job: Job, spec: JobSpec) -> Path | None:
        """The job's uploaded code, unpacked once per archive; Ray uploads it to the cluster."""
        if spec.code is None:
            return None
        content = await code_repository.content(session, job.project_id, spec.code)
        if content is None:
            raise LookupError(f"code {spec.code} of job {job.id} is gone")
        folder = Path(self.settings.code_cache_path).expanduser() / spec.code.removeprefix("sha256:")
        return await asyncio.to_thread(
            archive.extract,
            content,
            folder,
            max_files=self.settings.max_code_files,
            max_unpacked_bytes=self.settings.max_code_unpacked_bytes,
        )

    def _launch(
        self, job: Job, spec: JobSpec, n: int, sub_id: str, token: str, working_dir: Path | None = None
    ) -> Launch:
        env = {
            ENV_COLLECTIVE_TIMEOUT_S: str(self.settings.collective_timeout_s),  # a job's env may override it
            **spec.env,
            ENV_JOB_ID: str(job.id),
            ENV_ATTEMPT: str(n),
            ENV_JOB_SPEC: spec.model_dump_json(),
            ENV_JOB_TOKEN: token,
            ENV_STORAGE_PATH: self.settings.storage_path,
            "RAY_CHDIR_TO_TRIAL_DIR": "0",  # workers run in the job's working directory
        }
        if self.settings.api_url:
            env[ENV_API_URL] = self.settings.api_url
        runtime_env: dict[str, object] = {"env_vars": env}
        if working_dir is not None:
            runtime_env["working_dir"] = str(working_dir)
        if spec.pip:
            runtime_env["pip"] = list(spec.pip)
        command = [sys.executable, "-m", "workers.driver", "--job-id", str(job.id), "--attempt", str(n)]
        return Launch(
            submission_id=sub_id,
            entrypoint=shlex.join(command),
            runtime_env=runtime_env,
            metadata={"trainmaster_job_id": str(job.id), "attempt": str(n), "name": job.name[:64]},
            entrypoint_num_cpus=self.settings.driver_cpus,
        )

    async def _submit(self, launch: Launch) -> None:
        job_id = uuid.UUID(launch.metadata["trainmaster_job_id"])
        try:
            started = await asyncio.to_thread(self.ray.submit, launch)
        except RayUnavailable as exc:
            log.warning(
                json.dumps({"event": "submit_deferred", "submission_id": launch.submission_id, "error": str(exc)})
            )
            # The attempt stays pending; reconcile submits it again (same id) until launch_timeout_s.
            async with self.sessions() as session, session.begin():
                job = await repo.lock_if_leased(session, job_id, self.owner)
                attempt = repo.latest_attempt(job) if job else None
                if job is not None and attempt is not None and attempt.status == PENDING:
                    if attempt.error is None:
                        await record_event(session, job, "launch_retry", f"Ray refused the launch, retrying: {exc}")
                    attempt.error = f"Ray refused the launch: {exc}"
            return
        maybe_die("after_submit")  # Ray runs it; the attempt is not marked yet
        log.info(
            json.dumps(
                {"event": "submitted" if started else "already_submitted", "submission_id": launch.submission_id}
            )
        )
        async with self.sessions() as session, session.begin():
            job = await repo.lock_if_leased(session, job_id, self.owner)
            attempt = repo.latest_attempt(job) if job else None
            if attempt is not None and attempt.ray_submission_id == launch.submission_id and attempt.status == PENDING:
                attempt.status = SUBMITTED

    async def _infeasible(self, session: AsyncSession, job: Job, reason: str) -> None:
        if job.infeasible_since is None:
            job.infeasible_since = repo.now()
            await record_event(session, job, "infeasible", reason)
        waited = (repo.now() - job.infeasible_since).total_seconds()
        left = self.settings.infeasible_timeout_s - waited
        if left <= 0:
            await transition(
                session,
                job,
                JobStatus.failed,
                error=f"{reason} (gave up after {waited:.0f} s)",
                message="infeasible",
            )
        else:
            job.pending_reason = f"{reason} Fails in {left:.0f} s unless the cluster grows."

    async def _set_reasons_unreachable(self, error: str) -> None:
        async with self.sessions() as session, session.begin():
            for job in await repo.lock_queued(session, self.settings.admit_batch):
                job.pending_reason = f"the Ray cluster is unreachable ({error}); waiting for it to come back"

    # -- reconciliation -------------------------------------------------------------------------

    async def reconcile_round(self) -> None:
        """Follow every active job whose lease is ours (or free): Ray's truth wins, in one place."""
        async with self.sessions() as session, session.begin():
            job_ids = await repo.claim_active(session, self.owner, self.settings.lease_s)
        for job_id in job_ids:
            try:
                await self.reconcile_job(job_id)
            except RayUnavailable as exc:
                log.warning(json.dumps({"event": "ray_unavailable", "job_id": str(job_id), "error": str(exc)}))
                await self._ray_down(job_ids, str(exc))
                return
        self.ray_down_since = None

    async def _ray_down(self, job_ids: list[uuid.UUID], error: str) -> None:
        """Past ray_unreachable_timeout_s without Ray, active attempts are lost: retried or failed."""
        now = repo.now()
        if self.ray_down_since is None:
            self.ray_down_since = now
        down_for = (now - self.ray_down_since).total_seconds()
        if down_for < self.settings.ray_unreachable_timeout_s:
            return
        for job_id in job_ids:
            async with self.sessions() as session, session.begin():
                job = await repo.lock_if_leased(session, job_id, self.owner)
                attempt = repo.latest_attempt(job) if job else None
                if job is None or attempt is None or job.status not in repo.ACTIVE:
                    continue
                attempt.status, attempt.finished_at = LOST, now
                attempt.error = f"lost: the Ray cluster has been unreachable for {down_for:.0f} s ({error})"
                await self._after_failure(session, job, attempt.error)

    async def reconcile_job(self, job_id: uuid.UUID) -> None:
        async with self.sessions() as session, session.begin():
            job = await repo.lock_if_leased(session, job_id, self.owner)
            if job is None or job.status not in repo.ACTIVE:
                return
            attempt = repo.latest_attempt(job)
            if attempt is None:  # pragma: no cover - active jobs always have an attempt
                await transition(session, job, JobStatus.failed, error="active job without an attempt")
                return
            sub_id, attempt_status = attempt.ray_submission_id, attempt.status
        # Ray is asked outside any transaction; the answer is applied under the lease again below.
        info = await asyncio.to_thread(self.ray.info, sub_id)
        if info is None and attempt_status == PENDING:
            spec = JobSpec.model_validate(job.spec)
            async with self.sessions() as session, session.begin():
                job = await repo.lock_if_leased(session, job_id, self.owner)
                attempt = repo.latest_attempt(job) if job else None
                if job is None or attempt is None or attempt.ray_submission_id != sub_id:
                    return
                if job.status is JobStatus.cancelling:  # never launched: nothing to stop
                    attempt.status, attempt.finished_at = STOPPED, repo.now()
                    await self._finish(session, job, JobStatus.cancelled, None, "cancelled before launch")
                    return
                waited = (repo.now() - attempt.created_at).total_seconds()
                if waited > self.settings.launch_timeout_s:
                    attempt.status, attempt.finished_at = FAILED, repo.now()
                    attempt.error = f"not launched within {waited:.0f} s: {attempt.error or 'Ray did not accept it'}"
                    await self._after_failure(session, job, attempt.error)
                    return
                launch = await self._prepare_launch(session, job, spec, attempt.n, sub_id)
            await self._submit(launch)  # never acknowledged by Ray: submitting the same id is safe
            return
        maybe_die("while_reconciling")
        wants_stop = await self._stop_if_asked(job_id, sub_id, info)
        logs = await asyncio.to_thread(self.ray.logs, sub_id) if info is not None else ""
        async with self.sessions() as session, session.begin():
            job = await repo.lock_if_leased(session, job_id, self.owner)
            attempt = repo.latest_attempt(job) if job else None
            if job is None or attempt is None or attempt.ray_submission_id != sub_id:
                return
            await self._copy_logs(session, job, attempt, logs, final=info is not None and info.state.terminal)
            await self._apply(session, job, attempt, info, logs, wants_stop)

    async def _copy_logs(self, session: AsyncSession, job: Job, attempt: JobAttempt, text: str, final: bool) -> None:
        """Store the Ray job's new output lines, so logs outlive the cluster."""
        new = text[attempt.log_offset :]
        if not final:
            new = new[: new.rfind("\n") + 1]  # complete lines only; the rest comes next round
        if not new:
            return
        await logs_repository.append(session, job.id, attempt.n, "ray", [_clean(line) for line in new.splitlines()])
        attempt.log_offset += len(new)

    async def _stop_if_asked(self, job_id: uuid.UUID, sub_id: str, info: RayJobInfo | None) -> str | None:
        """Stop the Ray job for a cancel or a timeout; returns why it was stopped, if it was."""
        async with self.sessions() as session, session.begin():
            job = await repo.lock_if_leased(session, job_id, self.owner)
            attempt = repo.latest_attempt(job) if job else None
            if job is None or attempt is None:
                return None
            reason = None
            if job.status is JobStatus.cancelling or job.cancel_requested:
                reason = "cancel"
            elif attempt.status == TIMING_OUT or _timed_out(job, attempt):
                reason = "timeout"
                if attempt.status != TIMING_OUT:
                    attempt.status = TIMING_OUT
                    await record_event(session, job, "timeout", f"timeout_s={job.spec.get('timeout_s')} reached")
        if reason is not None and info is not None and not info.state.terminal:
            await asyncio.to_thread(self.ray.stop, sub_id)
        return reason

    async def _apply(
        self,
        session: AsyncSession,
        job: Job,
        attempt: JobAttempt,
        info: RayJobInfo | None,
        logs: str,
        wants_stop: str | None,
    ) -> None:
        now = repo.now()
        if info is None:
            attempt.status, attempt.finished_at = LOST, now
            attempt.error = "lost: Ray no longer knows this attempt (the cluster restarted or the job was deleted)"
            await self._after_failure(session, job, attempt.error)
            return
        if info.state is RayJobState.RUNNING and attempt.status in (PENDING, SUBMITTED):
            attempt.status, attempt.started_at = RUNNING, now
            if job.status is JobStatus.starting:
                await transition(session, job, JobStatus.running, message=f"attempt {attempt.n} running")
            return
        if not info.state.terminal:
            if attempt.status == PENDING:
                attempt.status = SUBMITTED
            return
        attempt.finished_at = now
        if wants_stop == "cancel":
            attempt.status = STOPPED
            await self._finish(session, job, JobStatus.cancelled, None, "cancelled; Ray job stopped")
        elif wants_stop == "timeout":
            attempt.status = TIMED_OUT
            error = f"timed out after timeout_s={job.spec.get('timeout_s')} s; the Ray job was stopped"
            await self._finish(session, job, JobStatus.timed_out, error, error)
        elif info.state is RayJobState.SUCCEEDED:
            attempt.status = SUCCEEDED
            await self._finish(session, job, JobStatus.succeeded, None, f"attempt {attempt.n} succeeded")
        else:
            attempt.status = FAILED
            attempt.error = error_text(info, logs)
            await self._after_failure(session, job, attempt.error)

    async def _after_failure(self, session: AsyncSession, job: Job, error: str) -> None:
        spec = JobSpec.model_validate(job.spec)
        if job.status is JobStatus.cancelling:
            await self._finish(session, job, JobStatus.cancelled, None, "cancelled")
            return
        retries_used = len(job.attempts) - 1
        if retries_used < spec.max_retries:
            job.lease_owner = None
            job.lease_expires_at = None
            await repo.revoke_job_tokens(session, job.id)
            await transition(
                session,
                job,
                JobStatus.queued,
                message=f"retry {retries_used + 1} of {spec.max_retries} after: {error}",
                data={"retry": retries_used + 1},
            )
            return
        await self._finish(session, job, JobStatus.failed, error, error)

    async def _finish(
        self, session: AsyncSession, job: Job, status: JobStatus, error: str | None, message: str
    ) -> None:
        job.lease_owner = None
        job.lease_expires_at = None
        await repo.revoke_job_tokens(session, job.id)
        await transition(session, job, status, message=message, error=error)


def _within(budget: dict[str, float], job: Job) -> bool:
    return job.gang_cpus <= budget["CPU"] + 1e-9 and job.gang_gpus <= budget["GPU"] + 1e-9


def _timed_out(job: Job, attempt: JobAttempt) -> bool:
    limit = job.spec.get("timeout_s")
    started = attempt.started_at or job.started_at
    if not limit or started is None:
        return False
    return (repo.now() - started).total_seconds() > float(limit)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _clean(line: str) -> str:
    return ANSI_ESCAPE.sub("", line).replace("\x00", "")[:8192]


def error_text(info: RayJobInfo, logs: str) -> str:
    """The end of the driver's log, where the actionable error is; Ray's message otherwise."""
    lines = [line for line in logs.splitlines() if line.strip()]
    marked = [line.split("[trainmaster] error: ", 1)[1] for line in lines if "[trainmaster] error: " in line]
    if marked:
        return marked[-1][:2000]
    tail = "\n".join(lines[-15:])
    return (tail or info.message or "the Ray job failed without output")[-2000:]
