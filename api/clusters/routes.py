"""HTTP for clusters: the registry (`/v1/clusters`, admin only) and one cluster's live view
(`GET /v1/cluster`, any project token for its own cluster)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from api.auth.deps import AdminPrincipal, ProjectPrincipal
from api.clusters import live, service
from api.db.session import Session
from api.deps import AppSettings
from api.errors import error_responses
from trainmaster.models import Cluster, ClusterInfo, ClusterList, ClusterSpec

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=error_responses(401, 403, 409, 422, 503))
live_router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=error_responses(401, 403, 404, 503))


def cluster_readers(request: Request) -> live.ClusterReaders:
    readers: live.ClusterReaders = request.app.state.cluster_readers
    return readers


Readers = Annotated[live.ClusterReaders, Depends(cluster_readers)]


@router.post("", response_model=Cluster, status_code=status.HTTP_201_CREATED)
async def create_cluster(spec: ClusterSpec, session: Session, _: AdminPrincipal, settings: AppSettings) -> Cluster:
    """Register a Ray cluster: its Jobs API address and where its Ray token is read from (a file in the
    secrets folder, or an environment variable named TRAINMASTER_CLUSTER_TOKEN_...)."""
    return service.to_wire(await service.create(session, spec, settings.secrets_path))


@router.get("", response_model=ClusterList)
async def list_clusters(session: Session, _: AdminPrincipal) -> ClusterList:
    return ClusterList(items=await service.list_all(session))


@live_router.get("", response_model=ClusterInfo)
async def cluster(
    session: Session,
    principal: ProjectPrincipal,
    readers: Readers,
    name: Annotated[
        str | None, Query(max_length=64, description="a cluster's name (admin); default: the token's")
    ] = None,
) -> ClusterInfo:
    """One Ray cluster's nodes with total and free CPU, GPU and memory, and its queue depth: the
    caller's project's cluster, or (an admin token) the one named.

    A Ray cluster that cannot be reached is reported (`reachable: false`), not an error of the API.
    """
    return await live.describe(session, principal, readers, name)
