"""How an attempt's end is written (reconcile.py follows attempts to it): what it ended as, whether
the job retries, goes back to the queue (not a retry) or ends; and each end releases the job: no lease,
no preemption pending, no cap on its size, no job token left (RELEASED, which
round_writes.FAIL_LAUNCHES clears too for many launches in one statement).

How an attempt ended is a code (`AttemptEnd`, stored in `job_attempts.ended_as`), never read back from
its error text: the requeue limits count attempts by it."""

from __future__ import annotations

import contextlib
import enum
import logging
import re
import signal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobAttempt
from api.dispatcher import repository as repo
from api.dispatcher.backend import RayJobInfo
from api.dispatcher.round_writes import RELEASED
from api.jobs.status import transition
from trainmaster.models import AttemptStatus, JobSpec, JobStatus

log = logging.getLogger("trainmaster.dispatcher")


class AttemptEnd(str, enum.Enum):
    """Why an attempt that was not the job's failure ended, where the dispatcher counts it."""

    unplaced = "unplaced"  # Ray left its gang pending past placement_timeout_s: queued again
    driver_crashed = "driver_crashed"  # its driver crashed (Ray's or the node's fault): queued again
    preempted = "preempted"  # it made room for another job: queued again


async def release(session: AsyncSession, job: Job) -> None:
    """The attempt is over: the job's RELEASED columns cleared, no job token left."""
    for name in RELEASED:
        setattr(job, name, None)
    await repo.revoke_job_tokens(session, job.id)


async def finish(session: AsyncSession, job: Job, status: JobStatus, error: str | None, message: str) -> None:
    await release(session, job)
    await transition(session, job, status, message=message, error=error)
    fields = {"job_id": str(job.id), "project_id": str(job.project_id), "status": status.value, "detail": message}
    log.info("job_finished", extra=fields if error is None else {**fields, "error": error[:300]})


async def after_failure(session: AsyncSession, job: Job, error: str) -> None:
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


async def requeue_at_most(
    session: AsyncSession,
    job: Job,
    attempt: JobAttempt,
    ended_as: AttemptEnd,
    times: int,
    message: str,
    data: dict[str, Any],
    reason: str,
) -> None:
    """`requeue`, while fewer than `times` attempts before this one ended the same way (`ended_as`);
    after that the attempt fails, and the job retries or fails as for any failure."""
    attempt.ended_as = ended_as.value
    if sum(1 for a in job.attempts if a.ended_as == ended_as.value) > times:
        attempt.status = AttemptStatus.failed
        await after_failure(session, job, f"{attempt.error}; back in the queue {times} times already")
        return
    await requeue(session, job, message, data, reason)


def _a_retry(attempt: JobAttempt) -> bool:
    crashed = attempt.status is AttemptStatus.lost and attempt.ended_as == AttemptEnd.driver_crashed.value
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


async def driver_crashed(session: AsyncSession, job: Job, attempt: JobAttempt, crash: str, tail: str) -> None:
    """The driver (platform code and Ray's) crashed: the attempt is lost and the job goes back to
    `queued`, not as a retry, and resumes from its latest checkpoint, at most DRIVER_CRASH_REQUEUES times."""
    attempt.status = AttemptStatus.lost
    attempt.error = f"{DRIVER_CRASHED} ({crash}), not an error of the job's code; its output ends: {tail}"[:2000]
    await requeue_at_most(
        session,
        job,
        attempt,
        AttemptEnd.driver_crashed,
        DRIVER_CRASH_REQUEUES,
        f"attempt {attempt.n}: {DRIVER_CRASHED} ({crash}); queued again (not a retry)",
        {"requeued": "driver_crashed", "crash": crash},
        f"its driver crashed ({crash}); queued again, waiting to be admitted",
    )


async def preempted(session: AsyncSession, job: Job, attempt: JobAttempt) -> None:
    """Back to the queue, priority kept; the next attempt resumes from the latest checkpoint."""
    by = str(job.preempted_by)
    attempt.status, attempt.ended_as = AttemptStatus.stopped, AttemptEnd.preempted.value
    attempt.error = f"preempted by {by}"
    message = f"preempted by {by}; resumes from its latest checkpoint (not a retry)"
    await requeue(session, job, message, {"preempted_by": by}, f"preempted by {by}; waits to be admitted again")


async def requeue(session: AsyncSession, job: Job, message: str, data: dict[str, Any], reason: str) -> None:
    """Its attempt stopped, not failed (a preemption, a gang Ray would not place): back to the queue,
    priority kept, not a retry; the next attempt resumes from the latest checkpoint."""
    await release(session, job)
    await transition(session, job, JobStatus.queued, message=message, data=data)
    job.pending_reason = reason


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def clean(line: str) -> str:
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
