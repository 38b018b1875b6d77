"""A cluster's live view (`GET /v1/cluster`): what its Ray cluster has and holds, read the way the
dispatcher reads it, plus its queue depth. Runs in the API process; the registry of clusters is
service.py beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.clusters import repository, service
from api.db.models import ClusterRow
from api.dispatcher.backend import RayUnavailable
from api.dispatcher.placement import ClusterCapacity, visible
from api.dispatcher.ray_jobs import RayJobsBackend
from api.errors import NotFound
from trainmaster.models import ClusterInfo, ClusterNode

READ_TIMEOUT_S = 5.0


class ClusterReader:
    """The API process's one reader of a Ray cluster: one RayJobsBackend, and with it one HTTP client,
    made on first use and closed at shutdown (the app's lifespan). A request that arrives while a read
    is under way shares its answer instead of starting another, so the backend is used by one thread
    at a time."""

    def __init__(self, make: Callable[[], RayJobsBackend]):
        self.make = make
        self.backend: RayJobsBackend | None = None
        self.reading: asyncio.Future[ClusterCapacity] | None = None

    async def read(self) -> ClusterCapacity:
        if self.reading is None:
            if self.backend is None:
                self.backend = self.make()
            self.reading = asyncio.ensure_future(asyncio.to_thread(self.backend.cluster))
            self.reading.add_done_callback(self._read_done)
        return await asyncio.shield(self.reading)  # one request gone must not cancel the others' read

    def _read_done(self, reading: asyncio.Future[ClusterCapacity]) -> None:
        self.reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved here, since every request waiting for it may have gone

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()


class ClusterReaders:
    """One `ClusterReader` per cluster record, by name, made on first use. The cluster `default` is
    the API's own TRAINMASTER_RAY_ADDRESS (service.backend_for); a record whose address or token
    source changed gets a new reader."""

    def __init__(self, default_address: str, timeout_s: float = READ_TIMEOUT_S, *, secrets_path: str):
        self.default_address = default_address
        self.timeout_s = timeout_s
        self.secrets_path = secrets_path
        self.readers: dict[str, tuple[tuple[object, ...], ClusterReader]] = {}

    def of(self, row: ClusterRow) -> ClusterReader:
        key = (row.address, row.token_file, row.token_env)
        kept = self.readers.get(row.name)
        if kept is not None and kept[0] == key:
            return kept[1]
        if kept is not None:
            kept[1].close()
        reader = ClusterReader(
            lambda: service.backend_for(row, self.default_address, self.timeout_s, secrets_path=self.secrets_path)
        )
        self.readers[row.name] = (key, reader)
        return reader

    def close(self) -> None:
        for _, reader in self.readers.values():
            reader.close()
        self.readers.clear()


async def describe(
    session: AsyncSession, principal: Principal, readers: ClusterReaders, name: str | None
) -> ClusterInfo:
    """The caller's cluster; an admin may name any, a project token only its own (else 404)."""
    name = name or principal.cluster_name
    if name != principal.cluster_name and not principal.is_admin:
        raise NotFound(f"no cluster {name!r} for this token's project (it runs on {principal.cluster_name!r})")
    row = await repository.find(session, name)
    if row is None:
        raise NotFound(f"no cluster {name!r}; `trainmaster cluster ls` lists them")
    depth = await repository.queued_on_cluster(session, row.id)
    mine = await repository.queued_in_project(session, principal.project_id)
    try:
        cluster = await readers.of(row).read()
    except RayUnavailable as exc:
        return ClusterInfo(name=name, reachable=False, error=str(exc), queue_depth=depth, project_queue_depth=mine)
    return ClusterInfo(
        name=name,
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
