"""HTTP for clusters (`/v1/clusters`, admin only). `GET /v1/cluster` (api/cluster/) is the live view."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.auth.deps import AdminPrincipal
from api.clusters import service
from api.db.session import Session
from api.deps import AppSettings
from api.errors import error_responses
from trainmaster.models import Cluster, ClusterList, ClusterSpec

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=error_responses(401, 403, 409, 422, 503))


@router.post("", response_model=Cluster, status_code=status.HTTP_201_CREATED)
async def create_cluster(spec: ClusterSpec, session: Session, _: AdminPrincipal, settings: AppSettings) -> Cluster:
    """Register a Ray cluster: its Jobs API address and where its Ray token is read from (a file in the
    secrets folder, or an environment variable named TRAINMASTER_CLUSTER_TOKEN_...)."""
    return service.to_wire(await service.create(session, spec, settings.secrets_path))


@router.get("", response_model=ClusterList)
async def list_clusters(session: Session, _: AdminPrincipal) -> ClusterList:
    return ClusterList(items=await service.list_all(session))
