from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from api.auth.deps import ProjectPrincipal
from api.cluster import service
from api.db.session import Session
from api.errors import error_responses
from trainmaster.models import ClusterInfo


def cluster_readers(request: Request) -> service.ClusterReaders:
    readers: service.ClusterReaders = request.app.state.cluster
    return readers


Readers = Annotated[service.ClusterReaders, Depends(cluster_readers)]

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=error_responses(401, 403, 404, 503))


@router.get("", response_model=ClusterInfo)
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
    return await service.describe(session, principal, readers, name)
