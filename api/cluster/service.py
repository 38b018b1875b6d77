"""What the Ray cluster has and holds, read the way the dispatcher reads it, plus the queue depth."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import Principal
from api.db.models import Job
from api.settings import Settings
from trainmaster.models import ClusterInfo, ClusterNode, JobStatus
from workers.dispatcher.backend import RayUnavailable
from workers.dispatcher.ray_jobs import RayJobsBackend

SHOWN = ("CPU", "GPU", "memory")


def _shown(resources: dict[str, float]) -> dict[str, float]:
    return {
        name: amount
        for name, amount in resources.items()
        if name in SHOWN or not name.startswith(("node:", "object_store_memory", "accelerator_type"))
    }


async def describe(session: AsyncSession, principal: Principal, settings: Settings) -> ClusterInfo:
    queued = select(func.count()).select_from(Job).where(Job.status == JobStatus.queued)
    depth = int((await session.execute(queued)).scalar_one())
    mine = int((await session.execute(queued.where(Job.project_id == principal.project_id))).scalar_one())
    try:
        cluster = await asyncio.to_thread(RayJobsBackend(settings.ray_address, timeout_s=5).cluster)
    except RayUnavailable as exc:
        return ClusterInfo(reachable=False, error=str(exc), queue_depth=depth, project_queue_depth=mine)
    return ClusterInfo(
        reachable=True,
        nodes=[ClusterNode(node_id=n.node_id, total=_shown(n.total), free=_shown(n.free)) for n in cluster.nodes],
        total=_shown(cluster.total()),
        free=_shown(cluster.free()),
        queue_depth=depth,
        project_queue_depth=mine,
    )
