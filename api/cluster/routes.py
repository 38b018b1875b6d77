from __future__ import annotations

from fastapi import APIRouter

from api.auth.deps import ProjectPrincipal
from api.cluster import service
from api.db.session import Session
from api.deps import AppSettings
from api.errors import error_responses
from trainmaster.models import ClusterInfo

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=error_responses(401, 503))


@router.get("", response_model=ClusterInfo)
async def cluster(session: Session, principal: ProjectPrincipal, settings: AppSettings) -> ClusterInfo:
    """Ray nodes with total and free CPU, GPU and memory, and the queue depth.

    A Ray cluster that cannot be reached is reported (`reachable: false`), not an error of the API.
    """
    return await service.describe(session, principal, settings)
