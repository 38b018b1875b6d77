"""The job status machine: every status change goes through `transition`, or, for the many jobs an
admission round starts at once, through a statement that asks `sources` which statuses may move.

`transition` writes the `job_events` row in the caller's transaction and queues a NOTIFY that
PostgreSQL delivers only when that transaction commits, so listeners never hear of a change that
rolled back. The bulk write (api/dispatcher/round_writes.py, ROUND_WRITES) changes only the rows whose
current status is one of `sources(target)`, and writes the event and NOTIFY of exactly the rows it
changed: both paths refuse what `ALLOWED` refuses.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, JobEvent
from api.errors import IllegalTransition
from trainmaster.models import JobStatus

S = JobStatus

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.queued: frozenset({S.starting, S.cancelled, S.failed}),
    S.starting: frozenset({S.running, S.succeeded, S.failed, S.timed_out, S.cancelling, S.queued}),
    S.running: frozenset({S.succeeded, S.failed, S.timed_out, S.cancelling, S.queued}),
    S.cancelling: frozenset({S.cancelled, S.succeeded, S.failed, S.timed_out}),
    S.succeeded: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
    S.timed_out: frozenset(),
}

JOB_CHANNEL = "tm_jobs"


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in ALLOWED[current]


def sources(target: JobStatus) -> list[str]:
    """The statuses a job may move to `target` from, as a bulk write's SQL takes them
    (`status = ANY(CAST(:sources AS job_status[]))`)."""
    return [current.value for current, targets in ALLOWED.items() if target in targets]


async def transition(
    session: AsyncSession,
    job: Job,
    target: JobStatus,
    *,
    message: str | None = None,
    error: str | None = None,
    data: dict[str, Any] | None = None,
) -> JobEvent:
    """Move `job` to `target` or raise IllegalTransition; flushes, never commits."""
    event = _change(job, target, message, error, data)
    session.add(event)
    await session.flush()
    await notify(session, job, target)
    return event


def _change(
    job: Job, target: JobStatus, message: str | None, error: str | None, data: dict[str, Any] | None
) -> JobEvent:
    """The checked change of `job` itself and its event row (not yet added to the session)."""
    current = job.status
    _check(job, target)
    now = datetime.now(timezone.utc)
    job.status = target
    if target is S.running and job.started_at is None:
        job.started_at = now
    if target.terminal:
        job.finished_at = now
        job.pending_reason = None
    if target is S.queued:
        job.pending_reason = "waiting for the dispatcher"
    if error is not None:
        job.error = error
    return JobEvent(
        job_id=job.id,
        kind="status",
        status=target,
        message=message,
        data={"from": current.value, **(data or {})},
    )


def _check(job: Job, target: JobStatus) -> None:
    if not can_transition(job.status, target):
        raise IllegalTransition(f"job {job.id} is {job.status.value}; it cannot become {target.value}")


async def record_event(
    session: AsyncSession,
    job: Job,
    kind: str,
    message: str | None = None,
    data: dict[str, Any] | None = None,
    *,
    before_new_row: Callable[[], Awaitable[None]] | None = None,
) -> JobEvent:
    """A notable event that is not a status change (placement, backend chosen, retry scheduled).

    The same event (kind, message and data) as the job's latest one is that row counted once more
    (`count`, `last_at`) instead of a new row: a job reporting one thing over and over keeps one row
    for the run, and events stay bounded by how often something new happens. `before_new_row` runs
    (and may refuse) only when a row is added, after the job's latest event is locked."""
    data = data or {}
    latest = (
        await session.execute(
            select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id.desc()).limit(1).with_for_update()
        )
    ).scalar_one_or_none()
    if latest is not None and (latest.kind, latest.status, latest.message, latest.data) == (kind, None, message, data):
        again = (
            update(JobEvent)
            .where(JobEvent.id == latest.id)
            .values(count=JobEvent.count + 1, last_at=func.now())
            .returning(JobEvent)
            .execution_options(populate_existing=True)
        )
        return (await session.execute(again)).scalar_one()
    if before_new_row is not None:
        await before_new_row()
    event = JobEvent(job_id=job.id, kind=kind, status=None, message=message, data=data)
    session.add(event)
    await session.flush()
    return event


async def notify(session: AsyncSession, job: Job, status: JobStatus) -> None:
    payload = json.dumps({"job_id": str(job.id), "status": status.value})
    await session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": JOB_CHANNEL, "payload": payload})
