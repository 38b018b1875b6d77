"""Following each active attempt in Ray to its end: running, success, failure with the error text
from the driver's log, cancel and timeout (the Ray job is stopped), lost attempts, retries, and the
copy of the Ray job's output into PostgreSQL so logs outlive the cluster.

Ray is asked outside any transaction; its answer is applied under the lease again (`leased`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobAttempt
from api.dispatcher import launch
from api.dispatcher import repository as repo
from api.dispatcher.backend import RayBackend, RayJobInfo, RayJobState, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.placement import describe, nodes_free
from api.jobs.status import record_event, transition
from api.logs import repository as logs_repository
from trainmaster.models import AttemptStatus, JobSpec, JobStatus

log = logging.getLogger("trainmaster.dispatcher")


async def reconcile_round(context: RoundContext) -> None:
    async with context.sessions() as session, session.begin():
        job_ids = await repo.claim_active(
            session, context.owner, context.settings.lease_s, context.settings.reconcile_batch
        )
    nodes = NodesFree(context.ray)
    for job_id in job_ids:
        try:
            await reconcile_job(context, job_id, nodes)
        except RayUnavailable as exc:
            log.warning(json.dumps({"event": "ray_unavailable", "job_id": str(job_id), "error": str(exc)}))
            await _ray_down(context, job_ids, str(exc))
            return
    context.ray_down_since = None


async def _ray_down(context: RoundContext, job_ids: list[uuid.UUID], error: str) -> None:
    """Past ray_unreachable_timeout_s without Ray, active attempts are lost: retried or failed."""
    if context.ray_down_since is None:
        context.ray_down_since = time.monotonic()  # how long this dispatcher has seen Ray down
    down_for = time.monotonic() - context.ray_down_since
    if down_for < context.settings.ray_unreachable_timeout_s:
        return
    for job_id in job_ids:
        async with context.leased(job_id) as held:
            if held is None or held.attempt is None or held.job.status not in repo.ACTIVE:
                continue
            held.attempt.status, held.attempt.finished_at = AttemptStatus.lost, held.now
            held.attempt.error = f"lost: the Ray cluster has been unreachable for {down_for:.0f} s ({error})"
            await _after_failure(held.session, held.job, held.attempt.error)


async def reconcile_job(context: RoundContext, job_id: uuid.UUID, nodes: NodesFree) -> None:
    async with context.leased(job_id) as held:
        if held is None or held.job.status not in repo.ACTIVE:
            return
        if held.attempt is None:  # pragma: no cover - active jobs always have an attempt
            await transition(held.session, held.job, JobStatus.failed, error="active job without an attempt")
            return
        sub_id, attempt_status, spec = held.attempt.ray_submission_id, held.attempt.status, held.job.spec
        starting = held.job.status is JobStatus.starting
        log_offset = held.attempt.log_offset
    info = await asyncio.to_thread(context.ray.info, sub_id)
    if info is None and attempt_status is AttemptStatus.pending:
        await _resubmit_pending(context, job_id, sub_id, JobSpec.model_validate(spec))
        return
    wants_stop = await _stop_if_asked(context, job_id, sub_id, info)
    final = info is not None and info.state.terminal
    new_output = await asyncio.to_thread(context.ray.logs, sub_id, log_offset, final) if info is not None else ""
    gang = Gang(reported=bool(context.settings.api_url))
    if starting and gang.reported and info is not None and info.state is RayJobState.RUNNING:
        gang.pending_reason = f"placement group pending: {describe(JobSpec.model_validate(spec))}{await nodes.text()}"
    async with context.leased(job_id, sub_id) as held:
        if held is None or held.attempt is None:
            return
        if held.attempt.log_offset == log_offset:  # else another round stored this output already
            await _copy_logs(held.session, held.job, held.attempt, new_output, final=final)
        await _apply(held.session, held.job, held.attempt, info, wants_stop, held.now, gang)


@dataclass
class Gang:
    """What decides that a job runs: with an API address, jobs report their worker group started
    (`workers_started`); without one, the Ray driver running is all the dispatcher can know."""

    reported: bool
    pending_reason: str | None = None


class NodesFree:
    """Each node's free room, read from Ray at most once per round however many gangs wait."""

    def __init__(self, ray: RayBackend):
        self.ray = ray
        self.cached: str | None = None

    async def text(self) -> str:
        if self.cached is None:
            try:
                cluster = await asyncio.to_thread(self.ray.cluster)
                self.cached = f"; nodes free: {nodes_free(cluster)}"
            except RayUnavailable:
                self.cached = ""
        return self.cached


async def _resubmit_pending(context: RoundContext, job_id: uuid.UUID, sub_id: str, spec: JobSpec) -> None:
    """An attempt Ray never acknowledged: submit the same id again (safe), cancel it, or give up."""
    async with context.leased(job_id, sub_id) as held:
        if held is None or held.attempt is None:
            return
        job, attempt = held.job, held.attempt
        if job.status is JobStatus.cancelling:  # never launched: nothing to stop
            attempt.status, attempt.finished_at = AttemptStatus.stopped, held.now
            await _finish(held.session, job, JobStatus.cancelled, None, "cancelled before launch")
            return
        waited = (held.now - attempt.created_at).total_seconds()
        if waited > context.settings.launch_timeout_s:
            attempt.status, attempt.finished_at = AttemptStatus.failed, held.now
            attempt.error = f"not launched within {waited:.0f} s: {attempt.error or 'Ray did not accept it'}"
            await _after_failure(held.session, job, attempt.error)
            return
        again = await launch.prepare(context.settings, held.session, job, spec, attempt.n)
    await launch.submit(context, again)


async def _stop_if_asked(context: RoundContext, job_id: uuid.UUID, sub_id: str, info: RayJobInfo | None) -> str | None:
    """Stop the Ray job for a cancel or a timeout; returns why it was stopped, if it was."""
    async with context.leased(job_id, sub_id) as held:
        if held is None or held.attempt is None:
            return None
        job, attempt = held.job, held.attempt
        reason = None
        if job.status is JobStatus.cancelling or job.cancel_requested:
            reason = "cancel"
        elif attempt.status is AttemptStatus.timing_out or _timed_out(job, attempt, held.now):
            reason = "timeout"
            if attempt.status is not AttemptStatus.timing_out:
                attempt.status = AttemptStatus.timing_out
                await record_event(held.session, job, "timeout", f"timeout_s={job.spec.get('timeout_s')} reached")
        elif job.preempt_requested_at is not None:
            waited = (held.now - job.preempt_requested_at).total_seconds()
            checkpointed = await repo.checkpoint_since(held.session, job.id, job.preempt_requested_at)
            if checkpointed or waited > context.settings.preemption_grace_s:
                reason = "preempt"
    if reason is not None and info is not None and not info.state.terminal:
        await asyncio.to_thread(context.ray.stop, sub_id)
    return reason


async def _copy_logs(session: AsyncSession, job: Job, attempt: JobAttempt, new: str, final: bool) -> None:
    """Store the Ray job's new output (what came after `log_offset`), so logs outlive the cluster."""
    if not final:
        new = new[: new.rfind("\n") + 1]  # complete lines only; the rest comes next round
    if not new:
        return
    await logs_repository.append(session, job.id, attempt.n, "ray", [_clean(line) for line in new.splitlines()])
    attempt.log_offset += len(new)


async def _apply(
    session: AsyncSession,
    job: Job,
    attempt: JobAttempt,
    info: RayJobInfo | None,
    wants_stop: str | None,
    now: datetime,
    gang: Gang,
) -> None:
    if info is None:
        attempt.status, attempt.finished_at = AttemptStatus.lost, now
        attempt.error = "lost: Ray no longer knows this attempt (the cluster restarted or the job was deleted)"
        await _after_failure(session, job, attempt.error)
        return
    if info.state is RayJobState.RUNNING:
        if attempt.status in (AttemptStatus.pending, AttemptStatus.submitted):
            attempt.status, attempt.started_at = AttemptStatus.running, now  # the driver runs
        if job.status is JobStatus.starting:
            if not gang.reported or await repo.workers_started(session, job.id, attempt.n):
                job.pending_reason = None
                await transition(session, job, JobStatus.running, message=f"attempt {attempt.n}: workers started")
            else:
                job.pending_reason = gang.pending_reason
        return
    if not info.state.terminal:
        if attempt.status is AttemptStatus.pending:
            attempt.status = AttemptStatus.submitted
        return
    attempt.finished_at = now
    if wants_stop == "cancel":
        attempt.status = AttemptStatus.stopped
        await _finish(session, job, JobStatus.cancelled, None, "cancelled; Ray job stopped")
    elif wants_stop == "preempt" and info.state is not RayJobState.SUCCEEDED:  # finishing first wins
        await _preempted(session, job, attempt)
    elif wants_stop == "timeout":
        attempt.status = AttemptStatus.timed_out
        error = f"timed out after timeout_s={job.spec.get('timeout_s')} s; the Ray job was stopped"
        await _finish(session, job, JobStatus.timed_out, error, error)
    elif info.state is RayJobState.SUCCEEDED:
        attempt.status = AttemptStatus.succeeded
        await _finish(session, job, JobStatus.succeeded, None, f"attempt {attempt.n} succeeded")
    else:
        attempt.status = AttemptStatus.failed
        attempt.error = error_text(info, "\n".join(await repo.last_log_lines(session, job.id, attempt.n)))
        lost = await repo.last_event(session, job.id, attempt.n, "workers_lost")
        if lost is not None and lost.message and not lost.data.get("restarts", True):
            attempt.error = f"{attempt.error} ({lost.message})"
        await _after_failure(session, job, attempt.error)


async def _after_failure(session: AsyncSession, job: Job, error: str) -> None:
    """Retry (a new attempt later, resuming from the latest checkpoint) while retries are left."""
    spec = JobSpec.model_validate(job.spec)
    if job.status is JobStatus.cancelling:
        await _finish(session, job, JobStatus.cancelled, None, "cancelled")
        return
    # Preempted attempts end `stopped` and are not retries: only failures and losses count.
    retries_used = sum(a.status in (AttemptStatus.failed, AttemptStatus.lost) for a in job.attempts) - 1
    if retries_used < spec.max_retries:
        await _release(session, job)
        await transition(
            session,
            job,
            JobStatus.queued,
            message=f"retry {retries_used + 1} of {spec.max_retries} after: {error}",
            data={"retry": retries_used + 1},
        )
        return
    await _finish(session, job, JobStatus.failed, error, error)


async def _release(session: AsyncSession, job: Job) -> None:
    """The attempt is over: no lease, no preemption pending, no job token left."""
    job.lease_owner = None
    job.lease_expires_at = None
    job.preempted_by = job.preempt_requested_at = None
    await repo.revoke_job_tokens(session, job.id)


async def _finish(session: AsyncSession, job: Job, status: JobStatus, error: str | None, message: str) -> None:
    await _release(session, job)
    await transition(session, job, status, message=message, error=error)


async def _preempted(session: AsyncSession, job: Job, attempt: JobAttempt) -> None:
    """Back to the queue, priority kept; the next attempt resumes from the latest checkpoint."""
    by = str(job.preempted_by)
    attempt.status = AttemptStatus.stopped
    attempt.error = f"preempted by {by}"
    await _release(session, job)
    await transition(
        session,
        job,
        JobStatus.queued,
        message=f"preempted by {by}; resumes from its latest checkpoint (not a retry)",
        data={"preempted_by": by},
    )
    job.pending_reason = f"preempted by {by}; waits to be admitted again"


def _timed_out(job: Job, attempt: JobAttempt, now: datetime) -> bool:
    """`timeout_s` is per job: counted from the first attempt's start, so a retry does not restart it.
    A user's limit is on the whole job's running time; time spent queued between attempts counts too,
    which keeps a job that keeps failing and retrying inside the limit it was given."""
    limit = job.spec.get("timeout_s")
    starts = [a.started_at for a in job.attempts if a.started_at is not None]
    if not limit or not starts:
        return False
    return (now - min(starts)).total_seconds() > float(limit)


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
