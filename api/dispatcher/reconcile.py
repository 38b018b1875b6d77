"""Following each active attempt in Ray to its end: running, success, failure with the error text
from the driver's log, cancel and timeout (the Ray job is stopped), lost attempts, retries, and the
copy of the Ray job's output into PostgreSQL so logs outlive the cluster.

Ray is asked outside any transaction; its answer is applied under the lease again (`leased`).

What each end writes (a retry, back to the queue, the job's end) is ending.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobAttempt
from api.dispatcher import gang_count, launch
from api.dispatcher import repository as repo
from api.dispatcher.backend import RayBackend, RayJobInfo, RayJobState, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.ending import (
    AttemptEnd,
    after_failure,
    clean,
    driver_crash,
    driver_crashed,
    error_text,
    finish,
    preempted,
    requeue_at_most,
)
from api.dispatcher.placement import describe, nodes_free
from api.jobs.status import record_event, transition
from api.logs import repository as logs_repository
from trainmaster.control import CHECKPOINT_READER, PREEMPT_SEEN
from trainmaster.models import AttemptStatus, JobSpec, JobStatus

log = logging.getLogger("trainmaster.dispatcher")


async def reconcile_round(context: RoundContext) -> None:
    async with context.sessions() as session, session.begin():
        job_ids = await repo.claim_active(
            session, context.owner, context.settings.lease_s, context.settings.reconcile_batch, context.cluster_id
        )
    nodes = NodesFree(context.ray)
    for job_id in job_ids:
        try:
            await reconcile_job(context, job_id, nodes)
        except RayUnavailable as exc:
            log.warning("ray_unavailable", extra={"job_id": str(job_id), "error": str(exc)})
            await _ray_down(context, job_ids, str(exc))
            return
        except Exception as exc:  # this job's alone: the round goes on with the others
            await _job_failed_round(context, job_id, exc)
            continue
        context.errors.pop(job_id, None)
    context.ray_down_since = None


async def _job_failed_round(context: RoundContext, job_id: uuid.UUID, exc: Exception) -> None:
    """A job whose reconcile raised (a bug, a stored row nothing can read): logged, tried again next
    round, and failed with the error once it raised `reconcile_error_limit` rounds in a row."""
    context.errors[job_id] += 1
    rounds = context.errors[job_id]
    log.exception("reconcile_failed", extra={"job_id": str(job_id), "rounds": rounds})
    if rounds < context.settings.reconcile_error_limit:
        return
    context.errors.pop(job_id, None)
    error = f"the dispatcher could not follow this job ({rounds} rounds in a row): {type(exc).__name__}: {exc}"[:2000]
    sub_id = None
    async with context.leased(job_id) as held:
        if held is None or held.job.status not in repo.ACTIVE:
            return
        if (attempt := held.attempt) is not None:
            sub_id = attempt.ray_submission_id
            attempt.status, attempt.finished_at, attempt.error = AttemptStatus.failed, held.now, error
        await finish(held.session, held.job, JobStatus.failed, error, "reconcile_failed")
    if sub_id is not None:
        with contextlib.suppress(RayUnavailable):  # else Ray ends it when its driver sees the job over
            await asyncio.to_thread(context.ray.stop, sub_id)


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
            await after_failure(held.session, held.job, held.attempt.error)


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
        starting_for = (held.now - held.attempt.created_at).total_seconds()
    info = await asyncio.to_thread(context.ray.info, sub_id)
    if info is None and attempt_status is AttemptStatus.pending:
        if context.backoff.due(sub_id):
            await _resubmit_pending(context, job_id, sub_id, JobSpec.model_validate(spec))
        return
    wants_stop = await _stop_if_asked(context, job_id, sub_id, info)
    final = info is not None and info.state.terminal
    gang = Gang(reported=bool(context.settings.api_url))
    new_output = ""
    if final and not context.backoff.due(f"logs:{sub_id}"):
        return  # its whole log could not be read last time: read again after the backoff
    if info is not None:
        try:
            new_output = await asyncio.to_thread(context.ray.logs, sub_id, log_offset, final)
        except RayUnavailable as exc:  # only a final read raises: the job's end waits for its logs
            if context.backoff.defer(f"logs:{sub_id}") < FINAL_LOGS_WAIT_S:
                log.warning("final_logs_retry", extra={"job_id": str(job_id), "error": str(exc)})
                return
            gang.logs_missing = str(exc)
        context.backoff.forget(f"logs:{sub_id}")
    # A read stops at log_read_max_chars: a finished attempt whose read filled it ends only once a
    # later round has read (and stored) the rest of its log.
    more = final and len(new_output) >= context.settings.log_read_max_chars
    if starting and gang.reported and info is not None and info.state is RayJobState.RUNNING:
        gang.pending_reason = f"placement group pending: {describe(JobSpec.model_validate(spec))}{await nodes.text()}"
        settings = context.settings
        if starting_for > min(settings.placement_timeout_s, settings.starting_timeout_s) and info.driver_job_id:
            state = await asyncio.to_thread(context.ray.gang_state, info.driver_job_id)
            gang.starting_for = starting_for
            if state.pending is not None and starting_for > settings.placement_timeout_s:
                # Admission's book said the gang fits; Ray says it does not: back to the queue.
                gang.requeue = state.pending
                await asyncio.to_thread(context.ray.stop, sub_id)
            elif starting_for > settings.starting_timeout_s:
                gang.placed = state.placed
                if not gang.placed:
                    await asyncio.to_thread(context.ray.stop, sub_id)
    if not starting and info is not None and info.state is RayJobState.RUNNING and info.driver_job_id:
        gang.ray_workers = await gang_count.ray_workers(context, spec, info.driver_job_id)
    async with context.leased(job_id, sub_id) as held:
        if held is None or held.attempt is None:
            return
        await gang_count.count_at_least(held.session, held.job, gang.ray_workers)
        if held.attempt.log_offset == log_offset:  # else another round stored this output already
            max_lines = context.settings.log_lines_per_job
            ending = final and not more
            await _copy_logs(held.session, held.job, held.attempt, new_output, final=ending, max_lines=max_lines)
        if more:
            return
        if gang.logs_missing is not None:
            await record_event(
                held.session,
                held.job,
                "logs_incomplete",
                f"the end of attempt {held.attempt.n}'s log could not be read from Ray; what is stored "
                f"stops at character {held.attempt.log_offset}: {gang.logs_missing}",
            )
        await _apply(held.session, held.job, held.attempt, info, wants_stop, held.now, gang)


# How long a finished attempt waits for its whole log from Ray (read again after each backoff) before
# it ends with the log it has and an event saying where it stops.
FINAL_LOGS_WAIT_S = 30.0


@dataclass
class Gang:
    """What decides that a job runs: with an API address, jobs report their worker group started
    (`workers_started`); without one, the Ray driver running is all the dispatcher can know."""

    reported: bool
    pending_reason: str | None = None
    placed: bool | None = None  # asked of Ray past starting_timeout_s: a placement group is CREATED
    requeue: str | None = None  # Ray's reason its placement group stayed pending past placement_timeout_s
    starting_for: float = 0.0
    logs_missing: str | None = None  # why the end of a finished attempt's log could not be read
    ray_workers: int | None = None  # a running elastic gang's workers, as its placement group shows them


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
            await finish(held.session, job, JobStatus.cancelled, None, "cancelled before launch")
            return
        waited = (held.now - attempt.created_at).total_seconds()
        if waited > context.settings.launch_timeout_s:
            attempt.status, attempt.finished_at = AttemptStatus.failed, held.now
            attempt.error = f"not launched within {waited:.0f} s: {attempt.error or 'Ray did not accept it'}"
            await after_failure(held.session, job, attempt.error)
            return
        again = await launch.prepare(context.settings, held.session, job, spec, attempt.n, attempt.selector)
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
        elif attempt.status is AttemptStatus.timing_out or _timed_out(job, attempt, _ended_at(info, held.now)):
            reason = "timeout"
            if attempt.status is not AttemptStatus.timing_out:
                attempt.status = AttemptStatus.timing_out
                await record_event(held.session, job, "timeout", f"timeout_s={job.spec.get('timeout_s')} reached")
        elif job.preempt_requested_at is not None:
            waited = (held.now - job.preempt_requested_at).total_seconds()
            since = await answered_after(held.session, job, attempt.n, job.preempt_requested_at)
            checkpointed = since is not None and await repo.checkpoint_since(held.session, job.id, since)
            if checkpointed or waited > context.settings.preemption_grace_s:
                reason = "preempt"
    if reason is not None and info is not None and not info.state.terminal:
        await asyncio.to_thread(context.ray.stop, sub_id)
    return reason


async def answered_after(session: AsyncSession, job: Job, attempt: int, requested: datetime) -> datetime | None:
    """After when a checkpoint answers a preemption request: one registered after the training code
    saw the request (event PREEMPT_SEEN), when it reads `should_checkpoint()` (CHECKPOINT_READER: both
    posted by trainmaster/control.py); before it has seen it (None), none does. A
    checkpoint it reported on its own just before (an epoch's end) would stop it after steps it trains
    before its next look, and the resumed run would train them again. Training code that never asks
    is stopped at its first checkpoint after the request."""
    events = await repo.first_events(session, job.id, attempt, (CHECKPOINT_READER, PREEMPT_SEEN))
    if (seen := next((at for kind, at in events if kind == PREEMPT_SEEN and at > requested), None)) is not None:
        return seen
    return None if any(kind == CHECKPOINT_READER for kind, _ in events) else requested


async def _copy_logs(
    session: AsyncSession, job: Job, attempt: JobAttempt, new: str, final: bool, max_lines: int = 0
) -> None:
    """Store the Ray job's new output (what came after `log_offset`), so logs outlive the cluster; lines
    past the job's `max_lines` are read (the offset moves on) and dropped."""
    if not final:
        new = new[: new.rfind("\n") + 1]  # complete lines only; the rest comes next round
    if not new:
        return
    lines = [clean(line) for line in new.splitlines()]
    await logs_repository.append(session, job.id, attempt.n, "ray", lines, max_lines=max_lines)
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
        await after_failure(session, job, attempt.error)
        return
    if info.state is RayJobState.RUNNING:
        if attempt.status in (AttemptStatus.pending, AttemptStatus.submitted):
            attempt.status, attempt.started_at = AttemptStatus.running, now  # the driver runs
        if job.status is JobStatus.starting:
            started = await repo.last_event(session, job.id, attempt.n, "workers_started") if gang.reported else None
            if not gang.reported or started is not None:
                job.pending_reason = None
                attempt.running_at = started.created_at if started is not None else now  # productive from here
                await transition(session, job, JobStatus.running, message=f"attempt {attempt.n}: workers started")
            elif gang.requeue is not None:
                await _unplaced(session, job, attempt, gang, now)
            elif gang.placed:
                job.pending_reason = None
                attempt.running_at = now
                await transition(
                    session,
                    job,
                    JobStatus.running,
                    message=f"attempt {attempt.n}: no workers_started report after {gang.starting_for:.0f} s, "
                    "but Ray placed its gang (placement group created)",
                )
            elif gang.placed is False:
                attempt.status, attempt.finished_at = AttemptStatus.failed, now
                attempt.error = (
                    f"the gang was not placed within starting_timeout_s ({gang.starting_for:.0f} s): "
                    f"{gang.pending_reason}; the Ray job was stopped"
                )
                await after_failure(session, job, attempt.error)
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
        await finish(session, job, JobStatus.cancelled, None, "cancelled; Ray job stopped")
    elif wants_stop == "preempt" and info.state is not RayJobState.SUCCEEDED:  # finishing first wins
        await preempted(session, job, attempt)
    elif wants_stop == "timeout" and not (info.state is RayJobState.SUCCEEDED and _in_time(job, attempt, info)):
        attempt.status = AttemptStatus.timed_out
        error = f"timed out after timeout_s={job.spec.get('timeout_s')} s; the Ray job was stopped"
        await finish(session, job, JobStatus.timed_out, error, error)
    elif info.state is RayJobState.SUCCEEDED:
        attempt.status = AttemptStatus.succeeded
        await finish(session, job, JobStatus.succeeded, None, f"attempt {attempt.n} succeeded")
    else:
        logs = "\n".join(await repo.last_log_lines(session, job.id, attempt.n))
        if (crash := driver_crash(info, logs)) is not None:
            await driver_crashed(session, job, attempt, crash, error_text(info, logs))
            return
        attempt.status = AttemptStatus.failed
        attempt.error = error_text(info, logs)
        lost = await repo.last_event(session, job.id, attempt.n, "workers_lost")
        if lost is not None and lost.message and not lost.data.get("restarts", True):
            attempt.error = f"{attempt.error} ({lost.message})"
        await after_failure(session, job, attempt.error)


# A gang Ray leaves pending goes back to the queue this many times; the next time, its attempt fails
# (and the job retries or fails as for any failure): admission and Ray disagree about it for good.
PLACEMENT_REQUEUES = 3
UNPLACED = "gang not placed by Ray"


async def _unplaced(session: AsyncSession, job: Job, attempt: JobAttempt, gang: Gang, now: datetime) -> None:
    """Admission admitted the gang against its book, but Ray left its placement group pending past
    `placement_timeout_s`: the Ray job was stopped, and the job goes back to `queued` with Ray's
    reason instead of holding its place in `starting` (not a retry)."""
    attempt.status, attempt.finished_at = AttemptStatus.stopped, now
    attempt.error = f"{UNPLACED} within {gang.starting_for:.0f} s ({gang.requeue}); {gang.pending_reason}"
    await requeue_at_most(
        session,
        job,
        attempt,
        AttemptEnd.unplaced,
        PLACEMENT_REQUEUES,
        f"attempt {attempt.n}: {UNPLACED} within {gang.starting_for:.0f} s ({gang.requeue}); "
        "stopped and queued again (not a retry)",
        {"requeued": "unplaced", "ray": gang.requeue},
        f"Ray left its gang pending ({gang.requeue}); queued again, waiting for room",
    )


def _timed_out(job: Job, attempt: JobAttempt, now: datetime) -> bool:
    """`timeout_s` is per job: counted from the first attempt's start, so a retry does not restart it.
    A user's limit is on the whole job's running time; time spent queued between attempts counts too,
    which keeps a job that keeps failing and retrying inside the limit it was given."""
    limit = job.spec.get("timeout_s")
    starts = [a.started_at for a in job.attempts if a.started_at is not None]
    if not limit or not starts:
        return False
    return (now - min(starts)).total_seconds() > float(limit)


def _ended_at(info: RayJobInfo | None, now: datetime) -> datetime:
    """The moment a timeout is judged at: when Ray saw the attempt end, if it did (a job that
    finished within its limit is not timed out because this round came late), else now."""
    if info is not None and info.state.terminal and info.end_time is not None:
        return min(info.end_time, now)
    return now


def _in_time(job: Job, attempt: JobAttempt, info: RayJobInfo) -> bool:
    """The attempt ended, by Ray's clock, within the job's limit (it finished before the stop)."""
    return info.end_time is not None and not _timed_out(job, attempt, info.end_time)
