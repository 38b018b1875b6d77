"""Decisions about jobs: submit, read, list, cancel, and the events a job reports (an elastic gang's
resize moves what it holds). Services flush; the request commits.

About 420 lines: the four verbs and the checks they share (ownership, writability, priority limits)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.code_packages import repository as code_repository
from api.db.direct import Direct, Runner
from api.db.models import Job as JobRow
from api.db.models import JobEvent as EventRow
from api.db.unavailable import DATABASE_DOWN, lost_in_flight
from api.errors import IdempotencyKeyReused, IllegalTransition, JobNotFound, SubmitInDoubt, ValidationError
from api.jobs import gang_size, listing, repository
from api.jobs.status import JOB_CHANNEL, record_event, transition
from api.limits.service import WriteLimits
from api.queues import repository as queues
from api.queues.ranks import Older, QueueRanks, Stamp
from trainmaster.models import Attempt, EventList, Job, JobControl, JobEvent, JobEventIn, JobSpec, JobStatus

MAX_IDEMPOTENCY_KEY = 256
log = logging.getLogger("trainmaster.api")


def _hash_of(spec_json: dict[str, Any]) -> str:
    canonical = json.dumps(spec_json, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


WAITING = "waiting for the dispatcher"


@dataclass(frozen=True)
class Submitted:
    """A job just stored (or found again by its idempotency key), and its answer."""

    id: uuid.UUID
    status: JobStatus
    wire: Job


def _queued_values(principal: Principal, spec: JobSpec, idempotency_key: str | None) -> dict[str, Any]:
    """The row of a new queued job (INSERT_QUEUED's parameters), its spec hashed for idempotent replays."""
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        raise ValidationError.field(["header", "Idempotency-Key"], f"must be 1-{MAX_IDEMPOTENCY_KEY} characters")
    check_priority(principal, spec.priority)
    spec_json = spec.model_dump(mode="json")
    resources = spec.scaling.worker_resources()
    return {
        "id": uuid.uuid4(),
        "project_id": principal.project_id,
        "name": spec.name,
        "spec": json.dumps(spec_json),
        "labels": json.dumps(spec.labels),
        "priority": spec.priority,
        # An elastic gang is held at its minimum until it reports a resize (`resized` events).
        "gang_cpus": resources.get("CPU", 0.0) * spec.scaling.min_workers,
        "gang_gpus": resources.get("GPU", 0.0) * spec.scaling.min_workers,
        "idempotency_key": idempotency_key,
        "request_hash": _hash_of(spec_json),
        "pending_reason": WAITING,
        "user_name": principal.user_name,
    }


def check_priority(principal: Principal, priority: int, loc: tuple[str | int, ...] = ("body", "priority")) -> None:
    """A job's priority is at most its project's max_priority (PATCH /v1/projects/{name})."""
    if priority > principal.max_priority:
        raise ValidationError.field(
            list(loc), f"at most {principal.max_priority}, the max_priority of project {principal.project_name!r}"
        )


def _queued_payload(job_id: uuid.UUID) -> str:
    return json.dumps({"job_id": str(job_id), "status": JobStatus.queued.value})


def _submitted(principal: Principal, spec: JobSpec, inserted: Any) -> Submitted:
    job_id, created_at, stored_spec, _notified, position = inserted
    job = Job(
        id=str(job_id),
        project=principal.project_name,
        name=spec.name,
        status=JobStatus.queued,
        spec=stored_spec,
        created_at=created_at,
        pending_reason=WAITING,
        queue_position=int(position),
        cluster=principal.cluster_name,
    )
    return Submitted(job_id, JobStatus.queued, job)


def _reused_key() -> ValidationError:
    return IdempotencyKeyReused.field(
        ["header", "Idempotency-Key"],
        "this key was already used with a different job spec; use a new key for a new job",
    )


def _no_code(spec: JobSpec) -> ValidationError:
    return ValidationError.field(["body", "code"], f"no uploaded code {spec.code}; upload it with POST /v1/code")


def _key_vanished() -> ValidationError:  # the conflicting row was deleted in between
    return IdempotencyKeyReused.field(["header", "Idempotency-Key"], "key conflict; retry")


async def submit(
    runner: Runner, principal: Principal, spec: JobSpec, idempotency_key: str | None
) -> tuple[Submitted, bool]:
    """Store a new queued job with its first event in one statement; returns (the job, created). On a
    direct connection (`POST /v1/jobs`) it commits when it returns; on a session (`OnSession`, a sweep's
    trials) it is part of the caller's transaction.

    With an Idempotency-Key, a second request with the same spec gets the first job back, whatever
    order concurrent requests commit in; the same key with another spec is refused.
    """
    values = _queued_values(principal, spec, idempotency_key)
    if spec.code is not None and not await code_repository.exists(runner, principal.project_id, spec.code):
        raise _no_code(spec)
    try:
        inserted = await queues.insert_queued(runner, values, JOB_CHANNEL, _queued_payload(values["id"]))
    except DATABASE_DOWN as exc:
        if not isinstance(runner, Direct) or not lost_in_flight(exc):
            raise  # nothing was committed: the plain 503 (or the caller's transaction fails whole)
        log.warning("submit_in_doubt", extra={"job_id": str(values["id"]), "error": type(exc).__name__})
        raise SubmitInDoubt(str(values["id"])) from exc
    if inserted is not None:
        log.info("job_submitted", extra={"job_id": str(values["id"]), "project": principal.project_name})
        return _submitted(principal, spec, inserted), True
    assert idempotency_key is not None
    found = await repository.idempotent_match(runner, principal.project_id, idempotency_key)
    if found is None:  # pragma: no cover
        raise _key_vanished()
    job_id, request_hash = found
    if request_hash != values["request_hash"]:
        raise _reused_key()
    job = await read(runner, principal, str(job_id))
    return Submitted(job_id, job.status, job), False


def parse_job_id(raw: str) -> uuid.UUID:
    return JobNotFound.unless_uuid(raw, "job")


async def get_owned(session: AsyncSession, principal: Principal, raw_id: str, *, for_update: bool = False) -> JobRow:
    """The job if the caller's project owns it; 404 otherwise, never revealing that it exists."""
    job = await repository.get_job(session, parse_job_id(raw_id), principal.project_id, for_update=for_update)
    if job is None:
        raise JobNotFound(f"no job {raw_id!r} in project {principal.project_name!r}")
    return job


async def read(
    runner: Runner, principal: Principal, raw_id: str, ranks: QueueRanks | None = None, arrived: float = 0.0
) -> Job:
    """One job as answered, read in one statement (attempts and queue position included). With `ranks`
    (this process's cache, api/queues/ranks.py), a queued job's count of its own project's older jobs
    (and their gangs) come from there when known as of `arrived` (the loop's clock when the request came)."""
    job_id = parse_job_id(raw_id)
    older = await ranks.older(str(job_id), arrived) if ranks is not None else None
    stamp = ranks.stamp() if ranks is not None else None  # before the read: what arrives during it applies
    row = await queues.read_job(runner, job_id, principal.project_id, older)
    if row is None:
        raise JobNotFound(f"no job {raw_id!r} in project {principal.project_name!r}")
    (job_id, name, status, spec, created_at, started_at, finished_at, pending, error, latest, attempts, position,
     counted, counted_cpus, counted_gpus, priority, created_us) = row  # fmt: skip
    if ranks is not None and stamp is not None and older is None and counted is not None:
        rank = (created_us, str(job_id), (counted, counted_cpus, counted_gpus))
        await _keep_rank(runner, ranks, stamp, principal.project_id, priority, rank)
    status = JobStatus(status)
    wire = Job(
        id=str(job_id),
        project=principal.project_name,
        name=name,
        status=status,
        spec=spec,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        attempts=attempts,
        pending_reason=_shown_reason(status, pending),
        error=error,
        latest_metrics=latest,
        queue_position=None if position is None else int(position),
        cluster=principal.cluster_name,
    )
    wire.goodput = goodput(wire.attempts)
    return wire


GROUP_RANKS_LIMIT = 20_000  # a group's head read whole at most this deep (about 10 ms at 10,000)


async def _keep_rank(
    runner: Runner,
    ranks: QueueRanks,
    stamp: Stamp,
    project_id: uuid.UUID,
    priority: int,
    counted: tuple[int, str, Older],
) -> None:
    """Keep a count just made; of a group this process holds nothing of, number the whole group once."""
    project = str(project_id)
    if ranks.cold(project, priority):
        head = await queues.group_ranks(runner, project_id, priority, GROUP_RANKS_LIMIT)
        ranks.put(project, priority, head, stamp, whole=True)
    ranks.put(project, priority, [counted], stamp)


async def cancel(session: AsyncSession, principal: Principal, raw_id: str) -> JobRow:
    job = await get_owned(session, principal, raw_id, for_update=True)
    if job.status is JobStatus.cancelling:
        return job
    if job.status.terminal:
        raise IllegalTransition(f"job {job.id} already {job.status.value}; there is nothing to cancel")
    job.cancel_requested = True
    if job.status is JobStatus.queued:
        await transition(session, job, JobStatus.cancelled, message="cancelled while queued")
    else:
        await transition(session, job, JobStatus.cancelling, message="cancel requested")
    return job


async def get_writable(session: AsyncSession, principal: Principal, raw_id: str) -> JobRow:
    """The job a caller may write to: its project's, and for a job token only that one job."""
    if principal.job_id is not None and str(principal.job_id) != raw_id:
        raise JobNotFound(f"no job {raw_id!r} for this job token")
    return await get_owned(session, principal, raw_id)


async def control(session: AsyncSession, principal: Principal, raw_id: str) -> JobControl:
    job = await get_writable(session, principal, raw_id)
    if job.preempt_requested_at is None:
        if not (job.shrink_to and job.preempted_by):
            return JobControl()
        # A gang shrunk for a job that has ended since may grow again (its policy grows it when there is room).
        making_room_for = await session.get(JobRow, job.preempted_by)
        if making_room_for is None or making_room_for.status.terminal:
            return JobControl(reason=f"the cap for {job.preempted_by} is lifted: it has ended")
        return JobControl(max_workers=job.shrink_to, reason=f"shrunk to make room for {job.preempted_by}")
    return JobControl(checkpoint=True, reason=f"preempted by {job.preempted_by}", max_workers=job.shrink_to)


async def add_event(
    session: AsyncSession, principal: Principal, raw_id: str, event: JobEventIn, limits: WriteLimits
) -> JobEvent:
    """Within the project's events a second and the job's events in all (a repeat of the job's latest
    event adds no row and counts against the rate only); past either, 429 and nothing is written."""
    job = await get_writable(session, principal, raw_id)
    limits.take_event(job.project_id)
    if event.kind == "resized":
        resized(job, event.data.get("to"))

    async def within_limit() -> None:
        await limits.check_new_event(session, job.id)

    row = await record_event(session, job, event.kind, event.message, event.data, before_new_row=within_limit)
    return _event_to_wire(row)


def resized(job: JobRow, workers: object) -> None:
    """An elastic gang's new size, reported by its controller: what the job holds (and so its
    project's usage, its quota and admission's book) follows it. Hostile like all a job reports: a
    size outside the gang's {min, max} is refused (422, nothing recorded), and the dispatcher never
    counts fewer workers than Ray shows (api/jobs/gang_size.py). Only while it holds resources; any
    other report changes nothing."""
    scaling = gang_size.elastic_scaling(job)
    if scaling is None or job.status not in repository.ACTIVE:
        return
    gang_size.hold(job, scaling, gang_size.checked(scaling, workers))


def encode_cursor(job: JobRow) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return datetime.fromisoformat(created_at), uuid.UUID(job_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValidationError.field(["query", "cursor"], "not a cursor returned by this API") from None


ID_PREFIX = re.compile(r"^[0-9a-f-]{1,36}$")


def parse_id_prefix(raw: str) -> str:
    prefix = raw.strip().lower()
    if not ID_PREFIX.match(prefix):
        raise ValidationError.field(["query", "id_prefix"], "must be 1-36 hex digits or dashes, the start of a job id")
    return prefix


def parse_labels(raw: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise ValidationError.field(["query", "label"], f"{item!r} must be key:value")
        labels[key] = value
    return labels


async def list_page(
    session: AsyncSession,
    principal: Principal,
    *,
    statuses: list[JobStatus],
    labels: list[str],
    limit: int,
    cursor: str | None,
    id_prefix: str | None = None,
    max_bytes: int | None = None,
) -> tuple[list[Job], str | None]:
    """A page of the project's jobs, newest first: at most `limit`, at most `max_bytes` of specs and
    labels (the first always); the cursor reaches the rest."""
    after = decode_cursor(cursor) if cursor else None
    rows, trimmed = await listing.list_jobs(
        session,
        principal.project_id,
        statuses=statuses,
        labels=parse_labels(labels),
        limit=limit + 1,
        after=after,
        id_prefix=parse_id_prefix(id_prefix) if id_prefix is not None else None,
        max_bytes=max_bytes,
    )
    page, more = rows[:limit], len(rows) > limit or trimmed
    positions = await queues.queue_positions(session, page)
    items = [to_wire(job, principal.project_name, positions.get(job.id), principal.cluster_name) for job in page]
    return items, encode_cursor(page[-1]) if more and page else None


async def describe(session: AsyncSession, principal: Principal, job: JobRow) -> Job:
    positions = await queues.queue_positions(session, [job])
    return to_wire(job, principal.project_name, positions.get(job.id), principal.cluster_name)


async def events(
    session: AsyncSession, principal: Principal, raw_id: str, *, after_id: int = 0, limit: int, max_bytes: int
) -> EventList:
    """A page of the job's events: at most `limit`, at most `max_bytes` of messages and data."""
    job = await get_owned(session, principal, raw_id)
    rows, more = await listing.list_events(session, job.id, after_id=after_id, limit=limit, max_bytes=max_bytes)
    return EventList(items=[_event_to_wire(row) for row in rows], next_after_id=rows[-1].id if more else None)


def _event_to_wire(row: EventRow) -> JobEvent:
    return JobEvent(
        id=row.id,
        job_id=str(row.job_id),
        kind=row.kind,
        status=row.status,
        message=row.message,
        data=row.data,
        created_at=row.created_at,
        count=row.count,
        last_at=row.last_at,
    )


def _shown_reason(status: JobStatus, pending_reason: str | None) -> str | None:
    """A job says why it waits only while it waits: queued, or starting until its gang is placed."""
    return pending_reason if status in (JobStatus.queued, JobStatus.starting) else None


def to_wire(job: JobRow, project_name: str, queue_position: int | None = None, cluster: str | None = None) -> Job:
    attempts = [
        Attempt(
            n=a.n,
            ray_submission_id=a.ray_submission_id,
            status=a.status,
            started_at=a.started_at,
            finished_at=a.finished_at,
            error=a.error,
            admitted_at=a.created_at,
            running_at=a.running_at,
            queue_s=a.queue_s,
            starting_s=a.starting_s,
            productive_s=a.productive_s,
            lost_s=a.lost_s,
        )
        for a in job.attempts
    ]
    return Job(
        id=str(job.id),
        project=project_name,
        name=job.name,
        status=job.status,
        spec=job.spec,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempts=attempts,
        pending_reason=_shown_reason(job.status, job.pending_reason),
        error=job.error,
        latest_metrics=job.latest_metrics,
        queue_position=queue_position,
        cluster=cluster,
        goodput=goodput(attempts),
    )


def goodput(attempts: list[Attempt], now: datetime | None = None) -> float | None:
    """Productive / allocated seconds over a job's attempts: an ended attempt's figures as its trigger
    wrote them; a live one's so far (all of its running time productive until it ends)."""
    now = now or datetime.now(UTC)
    productive = allocated = 0.0
    for a in attempts:
        if a.lost_s is not None:
            productive += a.productive_s or 0.0
            allocated += (a.starting_s or 0.0) + (a.productive_s or 0.0) + a.lost_s
        elif a.finished_at is None and a.admitted_at is not None:
            allocated += max(0.0, (now - a.admitted_at).total_seconds())
            productive += max(0.0, (now - a.running_at).total_seconds()) if a.running_at else 0.0
    return productive / allocated if allocated > 0 else None
