"""Following each active attempt in Ray to its end: running, success, failure with the error text
from the driver's log, cancel and timeout (the Ray job is stopped), lost attempts, retries, and the
copy of the Ray job's output into PostgreSQL so logs outlive the cluster.

Ray is asked outside any transaction; its answer is applied under the lease again (`leased`).

Over 400 lines on purpose: it is one state machine from Ray's answer to the job's next status, and its
cases (ended, lost, pending past its bound, cancelled, timed out, retried) are read together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobAttempt
from api.dispatcher import gang_count, launch
from api.dispatcher import repository as repo
from api.dispatcher.backend import RayBackend, RayJobInfo, RayJobState, RayUnavailable
from api.dispatcher.context import RoundContext
from api.dispatcher.ending import finish, release
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
            log.warning(json.dumps({"event": "ray_unavailable", "job_id": str(job_id), "error": str(exc)}))
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
    log.exception(json.dumps({"event": "reconcile_failed", "job_id": str(job_id), "rounds": rounds}))
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
                log.warning(json.dumps({"event": "final_logs_retry", "job_id": str(job_id), "error": str(exc)}))
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
            await _after_failure(held.session, job, attempt.error)
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
    lines = [_clean(line) for line in new.splitlines()]
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
        await _after_failure(session, job, attempt.error)
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
                await _after_failure(session, job, attempt.error)
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
        await _preempted(session, job, attempt)
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
            await _driver_crashed(session, job, attempt, crash, error_text(info, logs))
            return
        attempt.status = AttemptStatus.failed
        attempt.error = error_text(info, logs)
        lost = await repo.last_event(session, job.id, attempt.n, "workers_lost")
        if lost is not None and lost.message and not lost.data.get("restarts", True):
            attempt.error = f"{attempt.error} ({lost.message})"
        await _after_failure(session, job, attempt.error)


async def _after_failure(session: AsyncSession, job: Job, error: str) -> None:
    """Retry (a new attempt later, resuming from the latest checkpoint) while retries are left."""
    spec = JobSpec.model_validate(job.spec)
    if job.status is JobStatus.cancelling:
        await finish(session, job, JobStatus.cancelled, None, "cancelled")
        return
    # Preempted attempts end `stopped` and are not retries, nor are drivers' crashes queued again:
    # only failures and losses count.
    retries_used = sum(_a_retry(a) for a in job.attempts) - 1
    if retries_used < spec.max_retries:
        await release(session, job)
        await transition(
            session,
            job,
            JobStatus.queued,
            message=f"retry {retries_used + 1} of {spec.max_retries} after: {error}",
            data={"retry": retries_used + 1},
        )
        return
    await finish(session, job, JobStatus.failed, error, error)


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
    await _requeue_at_most(
        session,
        job,
        attempt,
        UNPLACED,
        PLACEMENT_REQUEUES,
        f"attempt {attempt.n}: {UNPLACED} within {gang.starting_for:.0f} s ({gang.requeue}); "
        "stopped and queued again (not a retry)",
        {"requeued": "unplaced", "ray": gang.requeue},
        f"Ray left its gang pending ({gang.requeue}); queued again, waiting for room",
    )


async def _requeue_at_most(
    session: AsyncSession,
    job: Job,
    attempt: JobAttempt,
    marker: str,
    times: int,
    message: str,
    data: dict[str, Any],
    reason: str,
) -> None:
    """`_requeue`, while fewer than `times` attempts before this one ended the same way (their error
    starts with `marker`: UNPLACED, DRIVER_CRASHED); after that the attempt fails, and the job retries
    or fails as for any failure."""
    if sum(1 for a in job.attempts if (a.error or "").startswith(marker)) > times:
        attempt.status = AttemptStatus.failed
        await _after_failure(session, job, f"{attempt.error}; back in the queue {times} times already")
        return
    await _requeue(session, job, message, data, reason)


def _a_retry(attempt: JobAttempt) -> bool:
    crashed = attempt.status is AttemptStatus.lost and (attempt.error or "").startswith(DRIVER_CRASHED)
    return attempt.status in (AttemptStatus.failed, AttemptStatus.lost) and not crashed


# A driver that crashed (below) is queued again this many times; the next time, its attempt fails (and
# the job retries or fails as for any failure): what crashes it then is the job's, or the node's for good.
DRIVER_CRASH_REQUEUES = 2
DRIVER_CRASHED = "the job's driver crashed"
# What a native crash leaves in a process's output: Ray's fatal-error report (a failed check), absl's
# and Ray's signal handlers, Python's fatal error (faulthandler).
CRASH_MARKERS = (
    "*** StackTrace Information ***",
    "*** Check failure stack trace: ***",
    " received at time=",
    "Fatal Python error: ",
)


def driver_crash(info: RayJobInfo, logs: str) -> str | None:
    """How the attempt's driver crashed, when it did: it ended without saying why (no `[trainmaster]
    error:` line, which the driver prints for every failure of the job's: workers/driver.py), killed by
    a signal nobody asked for (stops are handled before this) or with a native crash in its own output.
    That is Ray's or the node's fault, not the job's: it is queued again, not retried. None otherwise."""
    if driver_error(logs) is not None:
        return None
    if (signum := _killed_by(info.exit_code)) is not None:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(signum).name}, exit code {info.exit_code}"
        return f"killed by signal {signum}, exit code {info.exit_code}"
    own = [line for line in logs.splitlines() if not line.startswith("(")]  # workers' lines: "(name pid=...) ..."
    found = next((marker for marker in CRASH_MARKERS if any(marker in line for line in own)), None)
    return None if found is None else f"a native crash: {found.strip()!r} in its output"


def _killed_by(exit_code: int | None) -> int | None:
    """The signal an exit code says killed the process: Python's negative code, or a shell's 128 + n
    (Ray runs the entrypoint through `sh -c`)."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    return exit_code - 128 if 128 < exit_code < 160 else None


async def _driver_crashed(session: AsyncSession, job: Job, attempt: JobAttempt, crash: str, tail: str) -> None:
    """The driver (platform code and Ray's) crashed: the attempt is lost and the job goes back to
    `queued`, not as a retry, and resumes from its latest checkpoint, at most DRIVER_CRASH_REQUEUES times."""
    attempt.status = AttemptStatus.lost
    attempt.error = f"{DRIVER_CRASHED} ({crash}), not an error of the job's code; its output ends: {tail}"[:2000]
    await _requeue_at_most(
        session,
        job,
        attempt,
        DRIVER_CRASHED,
        DRIVER_CRASH_REQUEUES,
        f"attempt {attempt.n}: {DRIVER_CRASHED} ({crash}); queued again (not a retry)",
        {"requeued": "driver_crashed", "crash": crash},
        f"its driver crashed ({crash}); queued again, waiting to be admitted",
    )


async def _preempted(session: AsyncSession, job: Job, attempt: JobAttempt) -> None:
    """Back to the queue, priority kept; the next attempt resumes from the latest checkpoint."""
    by = str(job.preempted_by)
    attempt.status = AttemptStatus.stopped
    attempt.error = f"preempted by {by}"
    message = f"preempted by {by}; resumes from its latest checkpoint (not a retry)"
    await _requeue(session, job, message, {"preempted_by": by}, f"preempted by {by}; waits to be admitted again")


async def _requeue(session: AsyncSession, job: Job, message: str, data: dict[str, Any], reason: str) -> None:
    """Its attempt stopped, not failed (a preemption, a gang Ray would not place): back to the queue,
    priority kept, not a retry; the next attempt resumes from the latest checkpoint."""
    await release(session, job)
    await transition(session, job, JobStatus.queued, message=message, data=data)
    job.pending_reason = reason


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


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _clean(line: str) -> str:
    # The cutter (api/dispatcher/log_cut.py) bounds lines read from Ray; this bounds any other source.
    return ANSI_ESCAPE.sub("", line).replace("\x00", "")[: 2 * 65536]


# What the driver prints before every failure of the job's (workers/driver.py): the error a person reads.
DRIVER_ERROR = "[trainmaster] error: "


def driver_error(logs: str) -> str | None:
    """The last error the driver itself printed (its `DRIVER_ERROR` line), if any."""
    marked = [line.split(DRIVER_ERROR, 1)[1] for line in logs.splitlines() if DRIVER_ERROR in line]
    return marked[-1] if marked else None


def error_text(info: RayJobInfo, logs: str) -> str:
    """The end of the driver's log, where the actionable error is; Ray's message otherwise."""
    if (said := driver_error(logs)) is not None:
        return said[:2000]
    lines = [line for line in logs.splitlines() if line.strip()]
    tail = "\n".join(lines[-15:])
    return (tail or info.message or "the Ray job failed without output")[-2000:]
