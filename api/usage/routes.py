"""HTTP for usage: `GET /v1/usage`, JSON, or CSV with `Accept: text/csv`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from api.auth.deps import ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.usage import service
from trainmaster.models import UsageReport

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=error_responses(401, 403, 422, 503))


@router.get("", response_model=UsageReport)
async def read_usage(
    session: Session,
    principal: ProjectPrincipal,
    group_by: Annotated[str, Query(max_length=80, description="project, user, job or label:<key>")] = "project",
    start: Annotated[datetime | None, Query(alias="from", description="default: 30 days before `to`")] = None,
    end: Annotated[datetime | None, Query(alias="to", description="default: now")] = None,
    granularity: Annotated[Literal["hour", "day"] | None, Query()] = None,
    project: Annotated[str | None, Query(max_length=128, description="one project (admin)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="rows for job and label grouping")] = 1000,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Resource-hours of the attempts that ended in [from, to): allocated (admission to release) split
    into starting, productive (training ran) and lost (work since the last checkpoint thrown away by a
    failure, preemption, cancel or timeout), queue time and goodput, per group and period."""
    usage = await service.report(
        session,
        principal,
        group_by=group_by,
        start=start,
        end=end,
        granularity=granularity,
        project=project,
        limit=limit,
    )
    if accept is not None and "text/csv" in accept:
        return Response(service.to_csv(usage), media_type="text/csv")
    return Response(service.to_json(usage), media_type="application/json")  # encoded once (service.to_row)
