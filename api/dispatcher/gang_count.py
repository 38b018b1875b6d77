"""A running elastic gang is counted at no fewer workers than Ray's placement group holds for it, each
reconcile round, whatever its own `resized` reports say (api/jobs/gang_size.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.db.models import Job
from api.dispatcher.backend import RayUnavailable
from api.dispatcher.context import RoundContext
from api.jobs import gang_size
from api.jobs.status import record_event


async def ray_workers(context: RoundContext, spec: dict[str, Any], driver_job_id: str) -> int | None:
    """A running elastic gang's workers as Ray's placement group shows them (None: not elastic, or Ray
    did not say). Read outside the job's lease, like every other Ray call of the round."""
    if gang_size.elastic_of(spec) is None:
        return None
    try:
        return (await asyncio.to_thread(context.ray.gang_state, driver_job_id)).workers
    except RayUnavailable:
        return None


async def count_at_least(session: AsyncSession, job: Job, workers: int | None) -> None:
    """Raise the job's count to `workers` when Ray shows more than it is counted at, saying so."""
    if workers is None or (change := gang_size.at_least_what_ray_shows(job, workers)) is None:
        return
    before, now = change
    message = f"counted at {now} workers, not {before}: its placement group in Ray holds {now}"
    await record_event(session, job, "gang_counted", message, {"from": before, "to": now})
