"""Liveness, readiness and Prometheus metrics: no authentication."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.db.session import Session
from api.errors import error_responses
from api.jobs import repository as jobs_repository
from api.ops.prometheus import BUCKETS
from api.telemetry import repository as telemetry_repository

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
async def metrics(request: Request, session: Session) -> Response:
    service_metrics = request.app.state.metrics
    service_metrics.set_job_counts(await jobs_repository.count_by_status(session))
    service_metrics.platform.update(
        await telemetry_repository.gauges(session), await telemetry_repository.histogram_buckets(session, BUCKETS)
    )
    return Response(generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST)
