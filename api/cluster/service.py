"""What the Ray cluster has and holds, read the way the dispatcher reads it, plus the queue depth."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.db.models import Job
from api.dispatcher.backend import RayUnavailable
from api.dispatcher.placement import Cluster, visible
from api.dispatcher.ray_jobs import RayJobsBackend
from trainmaster.models import ClusterInfo, ClusterNode, JobStatus

READ_TIMEOUT_S = 5.0


class ClusterReader:
    """The API process's one reader of the Ray cluster: one RayJobsBackend, and with it one HTTP client,
    made on first use and closed at shutdown (the app's lifespan). A request that arrives while a read
    is under way shares its answer instead of starting another, so the backend is used by one thread
    at a time."""

    def __init__(self, address: str, timeout_s: float = READ_TIMEOUT_S):
        self.address = address
        self.timeout_s = timeout_s
        self.backend: RayJobsBackend | None = None
        self.reading: asyncio.Future[Cluster] | None = None

    async def read(self) -> Cluster:
        if self.reading is None:
            if self.backend is None:
                self.backend = RayJobsBackend(self.address, timeout_s=self.timeout_s)
            self.reading = asyncio.ensure_future(asyncio.to_thread(self.backend.cluster))
            self.reading.add_done_callback(self._read_done)
        return await asyncio.shield(self.reading)  # one request gone must not cancel the others' read

    def _read_done(self, reading: asyncio.Future[Cluster]) -> None:
        self.reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved here, since every request waiting for it may have gone

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


async def describe(session: AsyncSession, principal: Principal, reader: ClusterReader) -> ClusterInfo:
    queued = select(func.count()).select_from(Job).where(Job.status == JobStatus.queued)
    depth = int((await session.execute(queued)).scalar_one())
    mine = int((await session.execute(queued.where(Job.project_id == principal.project_id))).scalar_one())
    try:
        cluster = await reader.read()
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
