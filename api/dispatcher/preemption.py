"""Priority preemption (the `preemption` setting, off by default).

When a queued gang cannot fit, lower-priority *running* jobs may be asked to make room: each chosen
one is told to checkpoint (`trainmaster.should_checkpoint()` turns true in its training code, through
`GET /v1/jobs/{id}/control`), and reconcile stops it once a new checkpoint is registered or
`preemption_grace_s` has passed. It then returns to `queued` with the reason "preempted by <job>",
keeps its priority, and resumes from its latest checkpoint when admitted again; a preemption never
counts as a retry. Victims are the lowest priority first, then the most recently started (the least
work at risk). A job is never preempted when that would take its project below its guaranteed
share (`guaranteed_shares`).

Quota reclaim (always on, for projects in a cohort): a job that waits for resources while its project
holds less than its quota, and other members of its cohort run on quota they borrowed from it, takes
it back the same way: the borrowers' jobs are preempted, cheapest first (`_reclaim`), whatever their
priority.

Fair-share preemption (the `fair_share_preemption` setting, off by default): a job that would borrow and
waits for resources may take borrowed quota from cohort members above its project in fair share, while
each stays at or above the waiting project's share with the gang (`_fair_share`). The rules of both are
pure, in api/dispatcher/victims.py.

Shrinking comes first (issue 29): on either path, running elastic gangs above their `min` among the
candidates are asked to shrink (`shrink_to`, read by the job's scaling policy through the same
control endpoint: workers/elastic.py) before any job is preempted whole, and only when shrinking them
all frees enough. A shrunk gang keeps running, resized from its latest checkpoint in the same attempt,
at most that size until the job it made room for ends (the control endpoint lifts the cap then, and the
gang's policy grows it when there is room) or the attempt does; its `resized` event moves what it holds,
and the waiting gang is admitted. Guaranteed shares do not limit shrinking (the gang keeps its `min`).

Room is counted in totals (CPU, GPU), not per node: the victims' resources come back wherever they
ran, and the waiting gang is admitted by the normal admission round once its placement fits.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from api.db.models import Checkpoint, Job, Project
from api.dispatcher import victims
from api.dispatcher.placement import Cluster
from api.dispatcher.quotas import EPSILON, Book
from api.jobs.repository import ACTIVE
from api.jobs.status import record_event
from api.settings import Settings
from trainmaster.models import JobStatus, Scaling


async def make_room(
    settings: Settings,
    session: AsyncSession,
    job: Job,
    cluster: Cluster,
    now: datetime,
    book: Book | None = None,
    *,
    fair: bool = False,
) -> str | None:
    """Make room for `job`: with `book` (the job is within its project's quota, and its cohort lends
    some of that quota to others), by reclaiming it from jobs running on borrowed quota; with `book` and
    `fair` (the job would borrow), from borrowers above its project in fair share; with the `preemption`
    setting, by asking lower-priority running jobs to go. The reason to show it, or None."""
    already = await _victims_of(session, job, now, settings.preemption_grace_s)
    if already:
        names = ", ".join(str(v.id)[:8] for v in already)
        if all(v.preempt_requested_at is None for v in already):
            return f"shrinking {len(already)} elastic job(s) to make room ({names}): waiting for them to resize"
        return f"preempting {len(already)} job(s) to make room ({names}): waiting for them to checkpoint and stop"
    free = cluster.free()
    room = {"CPU": free.get("CPU", 0.0), "GPU": free.get("GPU", 0.0)}
    need = {"CPU": job.gang_cpus, "GPU": job.gang_gpus}
    if book is not None:
        taking = (
            _fair_share(settings, session, job, book, cluster, room, now)
            if fair
            else _reclaim(settings, session, job, book, room, now)
        )
        if made := await taking:
            return made
    if not settings.preemption:
        return None
    held = await _held_by_project(session, job)
    shares = settings.guaranteed_shares
    candidates = await _candidates(session, job)
    lower = f"(priority {job.priority} > "
    if shrunk := await _shrink(
        session, now, job, [v for v, _ in candidates], dict(room), need, lambda v: f"{lower}{v.priority})"
    ):
        return shrunk
    chosen: list[Job] = []
    for victim, project in candidates:
        if victims.covers(room, need):
            break
        share = shares.get(project, {})
        usage = held.setdefault(project, {"CPU": 0.0, "GPU": 0.0})
        if any(usage[r] - victims.gang(victim)[r] < share.get(r, 0.0) - EPSILON for r in ("CPU", "GPU")):
            continue  # within its project's guaranteed share
        chosen.append(victim)
        for resource, amount in victims.gang(victim).items():
            room[resource] += amount
            usage[resource] -= amount
    if not chosen or not victims.covers(room, need):
        return None
    names = await _ask(
        settings, session, job, chosen, now, lambda v: f"(priority {job.priority} > {v.priority})", "to make room", {}
    )
    return f"preempting {len(chosen)} lower-priority job(s) ({names}): waiting for them to checkpoint and stop"


async def _ask(
    settings: Settings,
    session: AsyncSession,
    job: Job,
    chosen: list[Job],
    now: datetime,
    why: Callable[[Job], str],
    purpose: str,
    data: dict[str, object],
) -> str:
    """Ask each of `chosen` to checkpoint and go for `job` (an event on each, one on `job`); their short ids."""
    for victim in chosen:
        victim.preempted_by = job.id
        victim.preempt_requested_at = now
        await record_event(
            session,
            victim,
            "preempt_requested",
            f"preempted by {job.id} {why(victim)}: checkpoint now; stopped within {settings.preemption_grace_s:g} s",
            {"preempted_by": str(job.id), **data},
        )
    names = ", ".join(str(v.id)[:8] for v in chosen)
    await record_event(
        session, job, "preempting", f"preempting {names} {purpose}", {"jobs": [str(v.id) for v in chosen], **data}
    )
    return names


async def _reclaim(
    settings: Settings, session: AsyncSession, job: Job, book: Book, room: dict[str, float], now: datetime
) -> str | None:
    """Preempt jobs of the cohort that run on borrowed quota, cheapest first (victims.reclaim). None
    when they cannot free enough."""
    need = victims.gang(job)
    standing = book.projects[job.project_id]
    borrowing = await _borrowing_jobs(session, book.borrowers(job.project_id))
    why = f"(project {standing.name} reclaims its quota, which this job's project borrowed in cohort {standing.cohort})"
    if shrunk := await _shrink(session, now, job, borrowing, dict(room), need, lambda _: why):
        return shrunk
    chosen = victims.reclaim(job, book, room, borrowing)
    if not chosen:
        book.reclaim_failed(job.project_id, need)
        return None
    purpose = f"to reclaim its quota: they run on quota borrowed in cohort {standing.cohort}"
    names = await _ask(settings, session, job, chosen, now, lambda _: why, purpose, {"reclaim": True})
    return (
        f"reclaiming its quota from cohort {standing.cohort}: preempting {len(chosen)} job(s) on borrowed "
        f"quota ({names}): waiting for them to checkpoint and stop"
    )


async def _fair_share(
    settings: Settings,
    session: AsyncSession,
    job: Job,
    book: Book,
    cluster: Cluster,
    room: dict[str, float],
    now: datetime,
) -> str | None:
    """Preempt jobs that run on borrowed quota of cohort members above `job`'s project in fair share
    (victims.fair_share); elastic ones among them shrink first. None when they cannot free enough."""
    standing = book.projects[job.project_id]
    borrowing = await _borrowing_jobs(session, book.borrowers(job.project_id))
    capacity = cluster.total()
    chosen = victims.fair_share(job, book, capacity, room, borrowing, settings.fair_share_preemption_margin)
    if not chosen:
        book.fair_share_failed(job.project_id, victims.gang(job))
        return None
    mine = victims.share_with(standing, victims.gang(job), capacity)

    def why(victim: Job) -> str:
        theirs = book.projects[victim.project_id]
        return (
            f"(fair share in cohort {standing.cohort}: project {theirs.name} holds a share of "
            f"{victims.share(theirs, theirs.usage, capacity):.4g} of the cluster, above project {standing.name}'s "
            f"{mine:.4g} with this job)"
        )

    if shrunk := await _shrink(session, now, job, chosen, dict(room), victims.gang(job), why):
        return shrunk
    purpose = f"for fair share: their projects are above {standing.name}'s in cohort {standing.cohort}"
    names = await _ask(settings, session, job, chosen, now, why, purpose, {"fair_share": True})
    return (
        f"preempting {len(chosen)} job(s) on borrowed quota for fair share in cohort {standing.cohort} "
        f"({names}): their projects' shares are above {standing.name}'s; waiting for them to checkpoint and stop"
    )


async def _borrowing_jobs(session: AsyncSession, project_ids: list[uuid.UUID]) -> list[Job]:
    """Running jobs of `project_ids` not yet asked to go, locked, cheapest to preempt first."""
    if not project_ids:
        return []
    last_checkpoint = (
        select(func.max(Checkpoint.created_at)).where(Checkpoint.job_id == Job.id).correlate(Job).scalar_subquery()
    )
    at_risk_since = func.coalesce(last_checkpoint, Job.started_at, func.now())
    query = (
        select(Job)
        .where(Job.status == JobStatus.running, Job.project_id.in_(project_ids), Job.preempt_requested_at.is_(None))
        .order_by(last_checkpoint.is_(None), at_risk_since.desc(), Job.priority, Job.id)
        .with_for_update(of=Job, skip_locked=True)
    )
    return list((await session.execute(query)).scalars())


async def _victims_of(session: AsyncSession, job: Job, now: datetime, grace_s: float) -> list[Job]:
    """The active jobs asked to go for `job`, and those asked to shrink for it within `grace_s`: the room
    a shrink frees shows in Ray a moment after the smaller group started (the old group's placement
    group goes), and until then nothing more is asked of anyone for `job`."""
    shrinking = Job.shrink_requested_at > now - timedelta(seconds=grace_s)
    query = select(Job).where(
        Job.preempted_by == job.id, Job.status.in_(ACTIVE), or_(Job.preempt_requested_at.is_not(None), shrinking)
    )
    return list((await session.execute(query)).scalars())


def _workers(job: Job, scaling: Scaling) -> int:
    """An elastic gang's size now, from what it holds (api/jobs/service.py, `resized`, keeps it so)."""
    per = scaling.worker_resources()
    resource = "CPU" if per.get("CPU", 0.0) > 0 else "GPU"
    held = job.gang_cpus if resource == "CPU" else job.gang_gpus
    return round(held / per[resource]) if per.get(resource, 0.0) > 0 else scaling.min_workers


async def _shrink(
    session: AsyncSession,
    now: datetime,
    job: Job,
    candidates: list[Job],
    room: dict[str, float],
    need: dict[str, float],
    why: Callable[[Job], str],
) -> str | None:
    """Make room by shrinking elastic gangs among `candidates` (in their order) toward their `min`,
    before anything is preempted whole (issue 29): each keeps running, resized from its latest
    checkpoint by its own scaling policy (workers/elastic.py reads `shrink_to`). None, and nothing
    asked, when shrinking all of them cannot free enough."""
    asked: list[tuple[Job, int, int]] = []  # (job, from, to)
    for victim in candidates:
        if victims.covers(room, need):
            break
        scaling = Scaling.model_validate(victim.spec.get("scaling", {}))
        if not scaling.elastic:  # the candidates are running jobs not asked to go
            continue
        size = _workers(victim, scaling)
        per = scaling.worker_resources()
        target = size
        while target > scaling.min_workers and not victims.covers(room, need):
            target -= 1
            for resource in room:
                room[resource] += per.get(resource, 0.0)
        if target < size:
            asked.append((victim, size, target))
    if not asked or not victims.covers(room, need):
        return None
    for victim, size, target in asked:
        victim.shrink_to, victim.preempted_by, victim.shrink_requested_at = target, job.id, now
        await record_event(
            session,
            victim,
            "shrink_requested",
            f"asked to shrink {size} -> {target} workers for {job.id} {why(victim)}: it keeps running, resized "
            "from its latest checkpoint",
            {"for": str(job.id), "from": size, "to": target},
        )
    names = ", ".join(str(v.id)[:8] for v, _, _ in asked)
    await record_event(
        session,
        job,
        "shrinking",
        f"shrinking {names} to make room, instead of preempting them",
        {"jobs": [{"id": str(v.id), "from": a, "to": b} for v, a, b in asked]},
    )
    return f"shrinking {len(asked)} elastic job(s) to make room ({names}): waiting for them to resize"


def _same_cluster(job: Job) -> Any:
    """Projects on `job`'s cluster: only its jobs hold what `job` waits for."""
    own = aliased(Project)
    return Project.cluster_id == select(own.cluster_id).where(own.id == job.project_id).scalar_subquery()


async def _candidates(session: AsyncSession, job: Job) -> list[tuple[Job, str]]:
    query = (
        select(Job, Project.name)
        .join(Project, Project.id == Job.project_id)
        .where(
            Job.status == JobStatus.running,
            Job.priority < job.priority,
            Job.preempt_requested_at.is_(None),
            _same_cluster(job),
        )
        .order_by(Job.priority, Job.started_at.desc())
        .with_for_update(of=Job, skip_locked=True)
    )
    return [(row[0], row[1]) for row in (await session.execute(query)).all()]


async def _held_by_project(session: AsyncSession, job: Job) -> dict[str, dict[str, float]]:
    query = (
        select(Project.name, func.sum(Job.gang_cpus), func.sum(Job.gang_gpus))
        .join(Project, Project.id == Job.project_id)
        .where(Job.status.in_(ACTIVE), _same_cluster(job))
        .group_by(Project.name)
    )
    return {name: {"CPU": float(cpus), "GPU": float(gpus)} for name, cpus, gpus in (await session.execute(query)).all()}
