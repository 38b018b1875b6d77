"""Liveness and readiness (no authentication) and Prometheus metrics: an admin or metrics token reads every
series, a project token its own project's (api/ops/project_view.py); TRAINMASTER_METRICS_PUBLIC=1: no token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from sqlalchemy import text

from api.auth.principal import Scope
from api.auth.service import authenticate
from api.db.session import Session
from api.errors import Forbidden, error_responses
from api.ops.project_view import ProjectView

router = APIRouter(
    tags=["ops"],
    responses=error_responses(
        503,
    ),
)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(session: Session) -> dict[str, str]:
    await session.execute(text("SELECT 1"))
    return {"status": "ready", "database": "ok"}


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, authorization: Annotated[str | None, Header()] = None) -> Response:
    """The service's figures; the database's from a snapshot at most `metrics_snapshot_s` old."""
    state = request.app.state
    source: Collector = state.metrics.registry
    if not state.settings.metrics_public:
        principal = await authenticate(state.direct, authorization, state.tokens)
        if principal.is_job_token:
            raise Forbidden("/metrics needs a project, metrics or admin token; a job token only reports its job")
        if principal.scope is Scope.project:
            source = ProjectView(source, principal.project_name)  # its own project's series, nothing else
    await state.platform_snapshot.refresh(state.sessions)
    return Response(generate_latest(source), media_type=CONTENT_TYPE_LATEST)
