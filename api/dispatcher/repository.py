"""Queries the dispatcher runs: the admission lock, quotas, a round's writes, leases, attempts.

The claim a round takes its batch with belongs to the queue (api/queues/sql.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Uuid, bindparam, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.models import ApiToken, Checkpoint, Job, JobAttempt, JobEvent, LogLine, Project, ProjectUsage
from api.dispatcher.quotas import Book, Standing
from api.jobs.repository import ACTIVE
from api.jobs.status import can_transition, sources
from api.queues.repository import QueuedJob
from trainmaster.models import JobStatus

ADMISSION_LOCK = 0x746D_6164  # "tmad": one admission round at a time per cluster across every dispatcher
STARTING_SOURCES = sources(JobStatus.starting)  # what ROUND_WRITES may move to starting
FAILED_SOURCES = sources(JobStatus.failed)  # and to failed


async def db_now(session: AsyncSession) -> datetime:
    """The database's clock: every time the dispatcher writes or compares comes from here."""
    return (await session.execute(select(func.now()))).scalar_one()


# Every statement of a round is about one cluster's projects (DESIGN.md, trust domains): `cluster` is
# the cluster's id, or NULL for every project (a dispatcher of one cluster, as tests and benches run it).
CLUSTER = bindparam("cluster", type_=Uuid)


PROJECT_ON_CLUSTER = or_(CLUSTER.is_(None), Project.cluster_id == CLUSTER)  # a `projects` row of it


def of_cluster(project_id: Any) -> Any:
    """The condition that `project_id` is a project of the round's cluster (CLUSTER)."""
    return or_(CLUSTER.is_(None), project_id.in_(select(Project.id).where(Project.cluster_id == CLUSTER)))


LOCK_ADMISSION = text("SELECT pg_advisory_xact_lock(CAST(:key AS int), hashtext(coalesce(CAST(:cluster AS text), '')))")


async def lock_admission(session: AsyncSession, cluster: uuid.UUID | None = None) -> None:
    """Serialise a cluster's admission rounds (held until the transaction ends): the resources already
    held are read and added to under this lock, so two dispatchers never admit against the same free
    capacity. Rounds of different clusters run side by side."""
    await session.execute(LOCK_ADMISSION, {"key": ADMISSION_LOCK, "cluster": cluster})


HELD_RESOURCES = select(
    func.now(), func.coalesce(func.sum(ProjectUsage.cpus), 0), func.coalesce(func.sum(ProjectUsage.gpus), 0)
).where(of_cluster(ProjectUsage.project_id))


async def held_resources(session: AsyncSession, cluster: uuid.UUID | None = None) -> tuple[datetime, float, float]:
    """The database's clock, and the CPUs and GPUs held by the cluster's active trainmaster jobs (their
    placement may not show in Ray yet): the sum of `project_usage`, which a trigger keeps equal to the
    active jobs' gangs. One statement, after `lock_admission` (its snapshot must be taken under the lock)."""
    row = (await session.execute(HELD_RESOURCES, {"cluster": cluster})).one()
    return row[0], float(row[1]), float(row[2])


# Fair sharing's history (migrations 0020, 0025), sampled when due: each project's share of the cluster's
# CPUs and GPUs (what its active jobs hold over the capacities) enters an exponential moving average with
# the given half-life, weighted by the time since that project's last sample. `history_weight` is how much
# of a full history its samples cover (0 for a new row): the average is over that time alone, not diluted
# by the time before the project's first job (decide.decayed is the same formula). A first sample of a
# row with no time behind it only records the capacities. Run by admission rounds under
# `lock_admission`, so dispatchers take turns, and only where `sampled_at` is `interval` old, so a round
# between samples changes nothing.
SAMPLE_FAIR_SHARE = text(
    """
    UPDATE project_usage u SET
        history_cpus = coalesce(
            (u.history_cpus * keep.kept + (1 - keep.w) * CASE WHEN :cpus > 0 THEN u.cpus / :cpus ELSE 0 END)
            / nullif(keep.covered, 0),
            u.history_cpus),
        history_gpus = coalesce(
            (u.history_gpus * keep.kept + (1 - keep.w) * CASE WHEN :gpus > 0 THEN u.gpus / :gpus ELSE 0 END)
            / nullif(keep.covered, 0),
            u.history_gpus),
        history_weight = keep.covered,
        cpu_capacity = :cpus, gpu_capacity = :gpus, sampled_at = now()
    FROM (
        -- w: the half-life weight the old samples keep; kept: the old weight that remains; covered: the new
        SELECT project_id, w, history_weight * w AS kept, history_weight * w + 1 - w AS covered
        FROM (
            SELECT project_id, history_weight,
                   power(0.5, extract(epoch FROM now() - coalesce(sampled_at, now())) / :half_life) AS w
            FROM project_usage
            WHERE (sampled_at IS NULL OR sampled_at <= now() - make_interval(secs => :interval))
              AND (CAST(:cluster AS uuid) IS NULL
                   OR project_id IN (SELECT id FROM projects WHERE cluster_id = CAST(:cluster AS uuid)))
        ) due
    ) keep
    WHERE u.project_id = keep.project_id
    """
)


async def sample_fair_share(
    session: AsyncSession,
    capacity: dict[str, float],
    half_life_s: float,
    interval_s: float,
    cluster: uuid.UUID | None = None,
) -> None:
    """Add what each project of the cluster holds now to its fair-share history, when a sample is due
    (SAMPLE_FAIR_SHARE): a share is of its own cluster's capacity."""
    await session.execute(
        SAMPLE_FAIR_SHARE,
        {
            "cpus": capacity.get("CPU", 0.0),
            "gpus": capacity.get("GPU", 0.0),
            "half_life": half_life_s,
            "interval": interval_s,
            "cluster": cluster,
        },
    )


QUOTA_BOOK = (
    select(
        Project,
        func.coalesce(ProjectUsage.cpus, 0),
        func.coalesce(ProjectUsage.gpus, 0),
        func.coalesce(ProjectUsage.history_cpus, 0),
        func.coalesce(ProjectUsage.history_gpus, 0),
    )
    .outerjoin(ProjectUsage, ProjectUsage.project_id == Project.id)
    .where(Project.quota != text("'{}'::jsonb"), PROJECT_ON_CLUSTER)
)


async def quota_book(session: AsyncSession, cluster: uuid.UUID | None = None) -> Book:
    """Every project of the cluster with a quota, what its active jobs hold and its fair-share history
    (one statement; projects are few). After `lock_admission`, like `held_resources`."""
    rows = (await session.execute(QUOTA_BOOK, {"cluster": cluster})).all()
    return Book(
        {
            project.id: Standing.of(project, float(cpus), float(gpus), {"CPU": float(hc), "GPU": float(hg)})
            for project, cpus, gpus, hc, hg in rows
        }
    )


# What an admission round decided, in one statement: the admitted gangs (`gangs`) move to starting
# under this dispatcher's lease, but only those whose status may still legally become starting
# (`sources`, from the status machine's table: api/jobs/status.py); each gang that moved, and only
# those, gets its attempt row (pending), job token, events (the round's storage `warning` first, then
# each status change with the status it left) and NOTIFY (sent by PostgreSQL at commit). The jobs the
# round could not place or knows cannot launch (`failures`) fail, each with its error, status event
# and NOTIFY, as `transition` would write them one at a time. The waiting jobs get their new reasons
# (`reasons`). The rows come as JSON documents, one parameter each. The self-join on `jobs AS old`
# reads each row as it was before the UPDATE (its status left). Returns the ids of the jobs that moved,
# each with whether it started (else it failed).
ROUND_WRITES = text(
    """
    WITH started AS (
        UPDATE jobs j SET status = 'starting', lease_owner = :owner, lease_expires_at = :lease_expires_at,
                          pending_reason = NULL, infeasible_since = NULL, bypassed_since = NULL
        FROM jsonb_to_recordset(CAST(:gangs AS jsonb))
             AS g(at int, job_id uuid, n int, submission_id text, message text, payload text, selector jsonb),
             jobs old
        WHERE j.id = g.job_id AND old.id = g.job_id AND old.status = ANY(CAST(:sources AS job_status[]))
        RETURNING g.*, old.status AS left_status
    ),
    failed AS (
        UPDATE jobs j SET status = 'failed', error = f.error, finished_at = now(), pending_reason = NULL
        FROM jsonb_to_recordset(CAST(:failures AS jsonb)) AS f(at int, job_id uuid, error text, message text),
             jobs old
        WHERE j.id = f.job_id AND old.id = f.job_id AND old.status = ANY(CAST(:failed_sources AS job_status[]))
        RETURNING f.*, old.status AS left_status
    ),
    attempts AS (
        INSERT INTO job_attempts (job_id, n, ray_submission_id, status, selector)
        SELECT s.job_id, s.n, s.submission_id, 'pending', s.selector FROM started s
    ),
    tokens AS (
        INSERT INTO api_tokens (id, project_id, job_id, token_hash, description, attempt)
        SELECT g.token_id, g.project_id, g.job_id, g.token_hash, 'job', s.n
        FROM jsonb_to_recordset(CAST(:gangs AS jsonb))
             AS g(token_id uuid, project_id uuid, job_id uuid, token_hash text)
        JOIN started s ON s.job_id = g.job_id
    ),
    events AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT e.job_id, e.kind, e.status, e.message, e.data
        FROM (
            SELECT 0 AS part, s.at, s.job_id, 'storage_warning' AS kind, NULL::job_status AS status,
                   CAST(:warning AS text) AS message, '{}'::jsonb AS data
            FROM started s WHERE CAST(:warning AS text) IS NOT NULL
            UNION ALL
            SELECT 1, s.at, s.job_id, 'status', 'starting', s.message, jsonb_build_object('from', s.left_status)
            FROM started s
            UNION ALL
            SELECT 2, f.at, f.job_id, 'status', 'failed', f.message, jsonb_build_object('from', f.left_status)
            FROM failed f
        ) AS e
        ORDER BY e.part, e.at
    ),
    waiting AS (
        UPDATE jobs j SET pending_reason = coalesce(r.reason, j.pending_reason),
                          infeasible_since = CASE WHEN :clear_infeasible AND r.reason IS NOT NULL THEN NULL
                                                  ELSE j.infeasible_since END,
                          bypassed_since = CASE WHEN r.bypassed AND j.status = 'queued'
                                                THEN coalesce(j.bypassed_since, now()) ELSE j.bypassed_since END
        FROM jsonb_to_recordset(CAST(:reasons AS jsonb)) AS r(job_id uuid, reason text, bypassed boolean)
        WHERE j.id = r.job_id
    )
    SELECT s.job_id, true, pg_notify(:channel, s.payload) FROM started s
    UNION ALL
    SELECT f.job_id, false, pg_notify(:channel, json_build_object('job_id', f.job_id, 'status', 'failed')::text)
    FROM failed f
    """
)


@dataclass(frozen=True)
class Gang:
    """One admitted job's rows for ROUND_WRITES, and the message of its status event."""

    job: QueuedJob
    n: int
    submission_id: str
    token_hash: str  # of its job token's claim (launch.build): the row authenticates nothing until claimed
    message: str
    selector: dict[str, str] | None = None  # the node-label domain it was placed inside (topology)


async def write_round(
    session: AsyncSession,
    *,
    gangs: Sequence[Gang] = (),
    warning: str | None = None,
    reasons: Mapping[uuid.UUID, str] | None = None,
    failures: Mapping[uuid.UUID, tuple[str, str]] | None = None,
    clear_infeasible: bool = True,
    bypassed: Sequence[uuid.UUID] = (),
    owner: str = "",
    lease_expires_at: datetime | None = None,
    channel: str = "",
) -> set[uuid.UUID]:
    """ROUND_WRITES; `warning` is an event for every gang that starts; `failures` (job id -> (error,
    event message)) fail; with `clear_infeasible` the waiting jobs are no longer marked infeasible
    (they can fit the cluster); `bypassed` were passed by a later job of their project (their
    `bypassed_since` is set unless it is already). Returns the ids of the gangs that moved to starting: a gang whose job
    left `queued` since the claim is left as it is."""
    if not gangs and not reasons and not failures and not bypassed:
        return set()
    gang_rows = [
        {
            "at": at,
            "job_id": str(gang.job.id),
            "n": gang.n,
            "submission_id": gang.submission_id,
            "message": gang.message,
            "token_id": str(uuid.uuid4()),
            "project_id": str(gang.job.project_id),
            "token_hash": gang.token_hash,
            "payload": json.dumps({"job_id": str(gang.job.id), "status": JobStatus.starting.value}),
            "selector": gang.selector,
        }
        for at, gang in enumerate(gangs)
    ]
    # One row per waiting job (a row changes once per statement): its new reason, whether it was passed.
    reasons, passed = reasons or {}, set(bypassed)
    reason_rows = [
        {"job_id": str(job_id), "reason": reasons.get(job_id), "bypassed": job_id in passed}
        for job_id in [*reasons, *(passed - reasons.keys())]
    ]
    failure_rows = [
        {"at": at, "job_id": str(job_id), "error": error, "message": message}
        for at, (job_id, (error, message)) in enumerate((failures or {}).items())
    ]
    result = await session.execute(
        ROUND_WRITES,
        {
            "gangs": json.dumps(gang_rows),
            "sources": STARTING_SOURCES,
            "failures": json.dumps(failure_rows),
            "failed_sources": FAILED_SOURCES,
            "warning": warning,
            "reasons": json.dumps(reason_rows),
            "clear_infeasible": clear_infeasible,
            "owner": owner,
            "lease_expires_at": lease_expires_at,
            "channel": channel,
        },
    )
    return {job_id for job_id, started, _ in result.all() if started}


# The launches Ray accepted, marked submitted under the fencing check of `leased_many` in one
# statement: the jobs still leased by this dispatcher are locked in id order, and only the attempt that
# is still a job's latest and still pending changes.
MARK_SUBMITTED = text(
    """
    WITH held AS MATERIALIZED (
        SELECT id FROM jobs WHERE id = ANY(CAST(:job_ids AS uuid[])) AND lease_owner = :owner ORDER BY id FOR UPDATE
    )
    UPDATE job_attempts a SET status = 'submitted'
    FROM held JOIN unnest(CAST(:job_ids AS uuid[]), CAST(:submission_ids AS text[])) AS s(job_id, submission_id)
         ON s.job_id = held.id
    WHERE a.job_id = held.id AND a.ray_submission_id = s.submission_id AND a.status = 'pending'
      AND a.n = (SELECT max(l.n) FROM job_attempts l WHERE l.job_id = held.id)
    """
)


async def mark_submitted(session: AsyncSession, submissions: Mapping[uuid.UUID, str], owner: str) -> None:
    await session.execute(
        MARK_SUBMITTED,
        {"job_ids": list(submissions), "submission_ids": list(submissions.values()), "owner": owner},
    )


# Launches that can never be made (their code package, Ray calling them invalid), failed in one
# statement under the same fencing as MARK_SUBMITTED: only a job still leased by this dispatcher whose
# latest attempt is still that pending submission changes. Each job moves as `moves` (its status ->
# the target the status machine allows: cancelling -> cancelled, else failed) says, or not at all;
# its attempt fails with the error, its lease and job tokens go, and its status event and NOTIFY are
# written, as `transition` and ending.finish would one job at a time. Returns the ids that moved.
FAIL_LAUNCHES = text(
    """
    WITH f AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS f(at int, job_id uuid, submission_id text, error text)
    ),
    held AS MATERIALIZED (
        SELECT j.id, j.status, m.target FROM jobs j
        JOIN jsonb_each_text(CAST(:moves AS jsonb)) AS m(source, target) ON m.source = j.status::text
        WHERE j.id = ANY(CAST(:job_ids AS uuid[])) AND j.lease_owner = :owner ORDER BY j.id FOR UPDATE OF j
    ),
    attempts AS (
        UPDATE job_attempts a SET status = 'failed', finished_at = now(), error = f.error
        FROM held JOIN f ON f.job_id = held.id
        WHERE a.job_id = held.id AND a.ray_submission_id = f.submission_id AND a.status = 'pending'
          AND a.n = (SELECT max(l.n) FROM job_attempts l WHERE l.job_id = held.id)
        RETURNING a.job_id, a.n, f.at, f.error
    ),
    moved AS (
        UPDATE jobs j SET status = CAST(held.target AS job_status),
                          error = CASE WHEN held.target = 'failed' THEN attempts.error ELSE j.error END,
                          finished_at = now(), pending_reason = NULL, lease_owner = NULL, lease_expires_at = NULL,
                          preempted_by = NULL, preempt_requested_at = NULL, shrink_to = NULL,
                          shrink_requested_at = NULL
        FROM attempts JOIN held ON held.id = attempts.job_id
        WHERE j.id = attempts.job_id
        RETURNING j.id, held.target, held.status AS left_status, attempts.n, attempts.at, attempts.error
    ),
    tokens AS (
        UPDATE api_tokens SET revoked_at = now() WHERE job_id IN (SELECT id FROM moved) AND revoked_at IS NULL
    ),
    events AS (
        INSERT INTO job_events (job_id, kind, status, message, data)
        SELECT m.id, 'status', CAST(m.target AS job_status),
               CASE WHEN m.target = 'failed' THEN 'attempt ' || m.n || ' could not be launched: ' || m.error
                    ELSE 'cancelled before launch' END,
               jsonb_build_object('from', m.left_status)
        FROM moved m ORDER BY m.at
    )
    SELECT m.id, pg_notify(:channel, json_build_object('job_id', m.id, 'status', m.target)::text) FROM moved m
    """
)


def _fail_target(status: JobStatus) -> JobStatus:
    return JobStatus.cancelled if status is JobStatus.cancelling else JobStatus.failed


# FAIL_LAUNCHES's `moves`: each status the status machine lets end that way, and its end.
FAIL_MOVES = json.dumps({s.value: _fail_target(s).value for s in JobStatus if can_transition(s, _fail_target(s))})


async def fail_launches(
    session: AsyncSession, failures: Mapping[uuid.UUID, tuple[str, str]], owner: str, channel: str
) -> set[uuid.UUID]:
    """FAIL_LAUNCHES for `failures` (job id -> (submission id, error)); the ids of the jobs that moved."""
    if not failures:
        return set()
    rows = [
        {"at": at, "job_id": str(job_id), "submission_id": submission, "error": error}
        for at, (job_id, (submission, error)) in enumerate(failures.items())
    ]
    result = await session.execute(
        FAIL_LAUNCHES,
        {
            "rows": json.dumps(rows),
            "job_ids": list(failures),  # the primary key's index finds them (a join on `rows` scanned jobs)
            "moves": FAIL_MOVES,
            "owner": owner,
            "channel": channel,
        },
    )
    return {row[0] for row in result.all()}


async def claim_active(
    session: AsyncSession, owner: str, lease_s: float, limit: int = 200, cluster: uuid.UUID | None = None
) -> list[uuid.UUID]:
    """Take (or renew) the lease of the cluster's active jobs that are ours or whose lease ran out.

    The least recently renewed come first, so past `limit` active jobs every one is still reached
    in turn: renewing a lease moves the job to the back.
    """
    expires = func.now() + timedelta(seconds=lease_s)
    candidates = (
        select(Job.id)
        .where(
            Job.status.in_(ACTIVE),
            or_(Job.lease_owner == owner, Job.lease_owner.is_(None), Job.lease_expires_at < func.now()),
            of_cluster(Job.project_id),
        )
        .order_by(Job.lease_expires_at.asc().nulls_first(), Job.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    result = await session.execute(
        update(Job)
        .where(Job.id.in_(candidates.scalar_subquery()))
        .values(lease_owner=owner, lease_expires_at=expires)
        .returning(Job.id),
        {"cluster": cluster},
    )
    return [row[0] for row in result.all()]


async def lock_if_leased(session: AsyncSession, job_id: uuid.UUID, owner: str) -> Job | None:
    """The fencing check: the job, locked, only while this dispatcher still holds its lease."""
    found = await lock_leased(session, [job_id], owner)
    return found[0] if found else None


async def lock_leased(session: AsyncSession, job_ids: Sequence[uuid.UUID], owner: str) -> list[Job]:
    """The fencing check for many jobs at once: those of `job_ids` this dispatcher still holds the
    lease of, locked in id order (two transactions locking overlapping sets never deadlock)."""
    query = (
        select(Job)
        .where(Job.id.in_(job_ids), Job.lease_owner == owner)
        .order_by(Job.id)
        .with_for_update()
        .options(selectinload(Job.attempts))
        .execution_options(populate_existing=True)
    )
    return list((await session.execute(query)).scalars())


def latest_attempt(job: Job) -> JobAttempt | None:
    return max(job.attempts, key=lambda a: a.n) if job.attempts else None


async def revoke_job_tokens(session: AsyncSession, job_id: uuid.UUID) -> None:
    await session.execute(
        update(ApiToken).where(ApiToken.job_id == job_id, ApiToken.revoked_at.is_(None)).values(revoked_at=func.now())
    )


async def last_event(session: AsyncSession, job_id: uuid.UUID, attempt: int, kind: str) -> JobEvent | None:
    """The attempt's latest event of `kind`, as the job reported it."""
    query = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.kind == kind, JobEvent.data["attempt"].as_integer() == attempt)
        .order_by(JobEvent.id.desc())
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def first_events(
    session: AsyncSession, job_id: uuid.UUID, attempt: int, kinds: tuple[str, ...]
) -> list[tuple[str, datetime]]:
    """The attempt's events of `kinds` (kind, when first reported), oldest first: one query."""
    query = (
        select(JobEvent.kind, JobEvent.created_at)
        .where(JobEvent.job_id == job_id, JobEvent.kind.in_(kinds), JobEvent.data["attempt"].as_integer() == attempt)
        .order_by(JobEvent.id)
    )
    return [(kind, at) for kind, at in (await session.execute(query)).all()]


async def last_log_lines(session: AsyncSession, job_id: uuid.UUID, attempt: int, limit: int = 200) -> list[str]:
    """The attempt's last stored output lines, oldest first (where a failure's error text is)."""
    query = (
        select(LogLine.line)
        .where(LogLine.job_id == job_id, LogLine.attempt == attempt)
        .order_by(LogLine.seq.desc())
        .limit(limit)
    )
    return list(reversed((await session.execute(query)).scalars().all()))


async def checkpoint_since(session: AsyncSession, job_id: uuid.UUID, since: datetime) -> bool:
    """Whether the job registered a checkpoint after `since` (a preempted job saving its work)."""
    query = select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.created_at > since).limit(1)
    return (await session.execute(query)).first() is not None
