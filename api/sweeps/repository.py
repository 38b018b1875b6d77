"""Queries for sweeps and their trials."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job, Sweep, SweepTrial
from trainmaster.models import JobStatus, SweepStatus

METRIC_READ_LIMIT = 5000  # per trial and round: a trial far behind catches up over a few rounds


async def get_sweep(
    session: AsyncSession, sweep_id: uuid.UUID, project_id: uuid.UUID | None = None, *, for_update: bool = False
) -> Sweep | None:
    query = select(Sweep).where(Sweep.id == sweep_id)
    if project_id is not None:
        query = query.where(Sweep.project_id == project_id)
    if for_update:
        query = query.with_for_update()
    return (await session.execute(query.execution_options(populate_existing=True))).scalar_one_or_none()


async def claim_running(session: AsyncSession, sweep_id: uuid.UUID) -> Sweep | None:
    """Lock one running sweep for this transaction, or None when another controller holds it."""
    query = (
        select(Sweep)
        .where(Sweep.id == sweep_id, Sweep.status == SweepStatus.running)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    )
    return (await session.execute(query)).scalar_one_or_none()


async def sweeps_to_serve(session: AsyncSession, limit: int) -> list[uuid.UUID]:
    """Up to `limit` running sweeps, the least recently served first (a new one before any), marked
    served now by the same statement. Every running sweep is picked within ceil(running / limit)
    rounds however many there are, even one whose rounds keep failing; sweeps another controller is
    picking at this moment are skipped, so two controllers take different ones."""
    least_recently_served = (
        select(Sweep.id)
        .where(Sweep.status == SweepStatus.running)
        .order_by(Sweep.served_at.asc().nulls_first(), Sweep.created_at, Sweep.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    served = (
        update(Sweep)
        .where(Sweep.id.in_(least_recently_served.scalar_subquery()))
        .values(served_at=func.now())
        .returning(Sweep.id)
        .execution_options(synchronize_session=False)
    )
    return list((await session.execute(served)).scalars())


async def list_sweeps(
    session: AsyncSession, project_id: uuid.UUID, *, statuses: Sequence[SweepStatus], limit: int
) -> list[Sweep]:
    query = select(Sweep).where(Sweep.project_id == project_id)
    if statuses:
        query = query.where(Sweep.status.in_(statuses))
    query = query.order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(limit)
    return list((await session.execute(query)).scalars())


@dataclass
class TrialWithJob:
    trial: SweepTrial
    job_status: JobStatus


async def trials(session: AsyncSession, sweep_id: uuid.UUID) -> list[TrialWithJob]:
    query = (
        select(SweepTrial, Job.status)
        .join(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id == sweep_id)
        .order_by(SweepTrial.n)
        .execution_options(populate_existing=True)
    )
    return [TrialWithJob(trial, status) for trial, status in (await session.execute(query)).all()]


async def trials_of_sweeps(session: AsyncSession, sweep_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[Any]]:
    """(trial, job status) per sweep, for lists."""
    query = (
        select(SweepTrial, Job.status)
        .join(Job, Job.id == SweepTrial.job_id)
        .where(SweepTrial.sweep_id.in_(sweep_ids))
        .order_by(SweepTrial.sweep_id, SweepTrial.n)
    )
    found: dict[uuid.UUID, list[Any]] = {sweep_id: [] for sweep_id in sweep_ids}
    for trial, status in (await session.execute(query)).all():
        found[trial.sweep_id].append(TrialWithJob(trial, status))
    return found


async def new_metric_points(
    session: AsyncSession, cursors: dict[uuid.UUID, int], metric: str
) -> dict[uuid.UUID, list[Any]]:
    """Rank 0's stored points of `metric` past each job's cursor, in the order they were stored."""
    if not cursors:
        return {}
    rows = await session.execute(
        text(
            "SELECT c.job_id, p.seq, p.step, p.value "
            "FROM unnest(CAST(:jobs AS uuid[]), CAST(:afters AS bigint[])) AS c(job_id, after_seq) "
            "CROSS JOIN LATERAL ("
            "  SELECT seq, step, value FROM metric_points m "
            "  WHERE m.job_id = c.job_id AND m.seq > c.after_seq AND m.name = :metric AND m.rank = 0 "
            "  ORDER BY m.seq LIMIT :limit"
            ") AS p ORDER BY c.job_id, p.seq"
        ),
        {
            "jobs": [str(job_id) for job_id in cursors],
            "afters": list(cursors.values()),
            "metric": metric,
            "limit": METRIC_READ_LIMIT,
        },
    )
    found: dict[uuid.UUID, list[Any]] = {}
    for row in rows.all():
        found.setdefault(row.job_id, []).append(row)
    return found
