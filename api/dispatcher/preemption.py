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
pure, in api/dispatcher/victims.py; which jobs go for which waiting gang is decided over a snapshot of the
cluster's active jobs (`snapshot`) by api/dispatcher/room.py, and this module writes it (`apply`).

Shrinking comes first: on either path, running elastic gangs above their `min` among the
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
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Checkpoint, Job, Project
from api.dispatcher.repository import of_cluster
from api.dispatcher.room import Active, Room
from api.jobs.repository import ACTIVE
from api.jobs.status import record_event
from api.settings import Settings
from trainmaster.models import JobStatus


async def snapshot(session: AsyncSession, cluster: uuid.UUID | None) -> list[Active]:
    """The cluster's active jobs as preemption reads them, with their latest checkpoint's time: one
    statement, read only by a round in which some waiting job may ask for room."""
    last_checkpoint = (
        select(func.max(Checkpoint.created_at)).where(Checkpoint.job_id == Job.id).correlate(Job).scalar_subquery()
    )
    query = (
        select(
            Job.id,
            Job.project_id,
            Project.name,
            Job.priority,
            Job.gang_cpus,
            Job.gang_gpus,
            Job.status,
            Job.spec,
            Job.started_at,
            last_checkpoint,
            Job.preempted_by,
            Job.preempt_requested_at,
            Job.shrink_requested_at,
        )
        .join(Project, Project.id == Job.project_id)
        .where(Job.status.in_(ACTIVE), of_cluster(Job.project_id))
    )
    rows = await session.execute(query, {"cluster": cluster})
    return [
        Active(job_id, project_id, name, priority, cpus, gpus, status is JobStatus.running, spec, *times)
        for job_id, project_id, name, priority, cpus, gpus, status, spec, *times in rows.all()
    ]


async def apply(settings: Settings, session: AsyncSession, job_id: uuid.UUID, room: Room, now: datetime) -> None:
    """Write what `room` asks for the waiting job `job_id`: each shrunk gang's cap, each preempted job's
    request, an event on each and one on the waiting job. A victim that ended or was asked by another
    dispatcher since the snapshot is left alone (its room shows next round)."""
    if not room.shrink and not room.preempt:
        return
    ids = [v.id for v, _, _ in room.shrink] + [v.id for v in room.preempt]
    query = (
        select(Job)
        .where(Job.id.in_(ids), Job.status == JobStatus.running, Job.preempt_requested_at.is_(None))
        .order_by(Job.id)
        .with_for_update()
    )
    rows = {job.id: job for job in (await session.execute(query)).scalars()}
    job = await session.get_one(Job, job_id)  # locked already, by the claim
    # Per victim: its id, the columns it gets, its event (kind, message, data) and what the waiting job's
    # event lists of it. A room shrinks or preempts, never both (room.choose).
    asks: list[tuple[uuid.UUID, dict[str, Any], str, str, dict[str, Any], Any]] = []
    flag = {"reclaim": {"reclaim": True}, "fair_share": {"fair_share": True}}.get(room.kind, {})
    for victim, size, target in room.shrink:
        message = (
            f"asked to shrink {size} -> {target} workers for {job_id} {room.why_each[victim.id]}: it keeps running, "
            "resized from its latest checkpoint"
        )
        data = {"for": str(job_id), "from": size, "to": target}
        listed = {"id": str(victim.id), "from": size, "to": target}
        asks.append(
            (victim.id, {"shrink_to": target, "shrink_requested_at": now}, "shrink_requested", message, data, listed)
        )
    for victim in room.preempt:
        message = (
            f"preempted by {job_id} {room.why_each[victim.id]}: checkpoint now; stopped within "
            f"{settings.preemption_grace_s:g} s"
        )
        data = {"preempted_by": str(job_id), **flag}
        asks.append((victim.id, {"preempt_requested_at": now}, "preempt_requested", message, data, str(victim.id)))
    asked, names = [], []
    for victim_id, columns, kind, message, data, listed in asks:
        if (row := rows.get(victim_id)) is None:
            continue
        row.preempted_by = job_id
        for name, value in columns.items():
            setattr(row, name, value)
        await record_event(session, row, kind, message, data)
        asked.append(listed)
        names.append(str(victim_id)[:8])
    if not asked:
        return
    if room.shrink:
        message, data = f"shrinking {', '.join(names)} to make room, instead of preempting them", {"jobs": asked}
        await record_event(session, job, "shrinking", message, data)
    else:
        message, data = f"preempting {', '.join(names)} {room.purpose}", {"jobs": asked, **flag}
        await record_event(session, job, "preempting", message, data)
