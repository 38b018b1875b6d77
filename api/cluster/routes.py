from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from api.auth.deps import ProjectPrincipal
from api.cluster import service
from api.db.session import Session
from api.errors import error_responses
from trainmaster.models import ClusterInfo


def cluster_reader(request: Request) -> service.ClusterReader:
    reader: service.ClusterReader = request.app.state.cluster
    return reader


Reader = Annotated[service.ClusterReader, Depends(cluster_reader)]

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=error_responses(401, 403, 503))


@router.get("", response_model=ClusterInfo)
async def cluster(session: Session, principal: ProjectPrincipal, reader: Reader) -> ClusterInfo:
    """Ray nodes with total and free CPU, GPU and memory, and the queue depth.

    A Ray cluster that cannot be reached is reported (`reachable: false`), not an error of the API.
    """
    return await service.describe(session, principal, reader)
