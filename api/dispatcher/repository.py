"""Queries the dispatcher runs: the admission lock, quotas, a round's writes, leases, attempts.

The claim a round takes its batch with belongs to the queue (api/queues/sql.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Uuid, bindparam, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from api.db.models import ApiToken, Checkpoint, Job, JobAttempt, JobEvent, LogLine, Project, ProjectUsage
from api.dispatcher.quotas import Book, Standing
from api.jobs.repository import ACTIVE

ADMISSION_LOCK = 0x746D_6164  # "tmad": one admission round at a time per cluster across every dispatcher


async def db_now(session: AsyncSession) -> datetime:
    """The database's clock: every time the dispatcher writes or compares comes from here."""
    return (await session.execute(select(func.now()))).scalar_one()


# Every statement of a round is about one cluster's projects (a cluster is a trust domain): `cluster` is
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
