"""What the Ray cluster has and holds, read the way the dispatcher reads it, plus the queue depth."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.db.models import Job
from api.dispatcher.backend import RayUnavailable
from api.dispatcher.placement import visible
from api.dispatcher.ray_jobs import RayJobsBackend
from api.settings import Settings
from trainmaster.models import ClusterInfo, ClusterNode, JobStatus


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
        nodes=[
            ClusterNode(node_id=n.node_id, ip=n.ip or None, total=visible(n.total), free=visible(n.free))
            for n in cluster.nodes
        ],
        total=visible(cluster.total()),
        free=visible(cluster.free()),
        queue_depth=depth,
        project_queue_depth=mine,
    )
