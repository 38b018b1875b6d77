"""HTTP for queues: `GET /v1/queues`, each project of the caller's cluster as its queue stands."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.auth.deps import ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.queues import service
from trainmaster.models import Queues

router = APIRouter(prefix="/v1/queues", tags=["queues"], responses=error_responses(401, 403, 422, 503))


@router.get("", response_model=Queues)
async def read_queues(
    session: Session,
    principal: ProjectPrincipal,
    cluster: Annotated[str | None, Query(max_length=64, description="another cluster (admin only)")] = None,
    limit: Annotated[int, Query(ge=0, le=200, description="waiting jobs shown per project")] = 20,
) -> Queues:
    """Per project of the caller's cluster (projects on one cluster share a trust domain): quota, what
    its active jobs hold, what of it is borrowed from or lent to its cohort, and its waiting jobs in
    admission order with their queue position and pending reason."""
    return await service.read(session, principal, cluster, limit)
