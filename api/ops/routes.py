"""Liveness and readiness (no authentication) and Prometheus metrics (an admin or metrics token, unless
TRAINMASTER_METRICS_PUBLIC=1)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.auth.principal import Scope
from api.auth.service import authenticate
from api.db.session import Session
from api.errors import Forbidden, error_responses

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
    if not state.settings.metrics_public:
        principal = await authenticate(state.direct, authorization, state.tokens)
        if principal.is_job_token or principal.scope not in (Scope.admin, Scope.metrics):
            raise Forbidden(
                "/metrics needs a token of scope metrics or admin: trainmaster token create --scope metrics"
            )
    await state.platform_snapshot.refresh(state.sessions)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
