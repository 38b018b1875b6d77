"""The FastAPI application: routers, error rendering, body limits, metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.auth.cache import TokenCache
from api.auth.routes import router as tokens_router
from api.checkpoints.routes import router as checkpoints_router
from api.clusters.live import ClusterReaders
from api.clusters.routes import live_router as cluster_router
from api.clusters.routes import router as clusters_router
from api.code_packages.gate import UploadGate
from api.code_packages.routes import router as code_router
from api.db.direct import Direct
from api.db.session import create_engine, session_factory
from api.db.unavailable import DATABASE_DOWN, database_unavailable
from api.errors import DomainError, domain_error_response, error_response, request_invalid_response
from api.jobs.fast import FastLane
from api.jobs.routes import router as jobs_router
from api.logs.routes import router as logs_router
from api.metrics.routes import router as metrics_router
from api.ops.body_limit import BodyLimitMiddleware
from api.ops.heap import freeze_startup_heap
from api.ops.parent import end_with_parent
from api.ops.prometheus import PlatformSnapshot, RequestMetricsMiddleware, ServiceMetrics
from api.ops.routes import router as ops_router
from api.projects.routes import router as projects_router
from api.queues.ranks import QueueRanks
from api.queues.routes import router as queues_router
from api.retention.service import start_retention
from api.settings import Settings, get_settings
from api.storage.routes import router as storage_router
from api.streaming.broker import Broker
from api.streaming.limits import StreamLimiter
from api.sweeps.routes import router as sweeps_router
from api.telemetry.service import start_telemetry
from api.ui.routes import UI_PREFIX, UiSecurityHeaders, static_files
from api.ui.routes import router as ui_router
from api.usage.routes import router as usage_router

log = logging.getLogger("trainmaster.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        end_with_parent()  # a worker of `trainmaster api --workers N` never outlives its supervisor
        engine = create_engine(settings)
        app.state.engine = engine
        app.state.sessions = session_factory(engine)
        app.state.direct = Direct(settings)
        await app.state.direct.open()
        app.state.tokens = TokenCache(settings.auth_cache_s)
        app.state.broker = Broker(settings.database_url, app.state.tokens, app.state.ranks)
        app.state.broker.start()  # the token cache is trusted only while it listens
        app.state.upload_gate = UploadGate.of(settings)  # code uploads this process reads at once
        app.state.stream_limiter = StreamLimiter(
            settings.max_streams_per_token, settings.stream_slots_dir, per_project=settings.max_streams_per_project
        )
        # Each connects on its first GET /v1/cluster.
        app.state.cluster_readers = ClusterReaders(settings.ray_address, secrets_path=settings.secrets_path)
        telemetry = start_telemetry(settings, "trainmaster-api")
        retention = start_retention(settings, app.state.sessions)
        try:
            yield
        finally:
            app.state.cluster_readers.close()
            await retention.stop()
            await telemetry.stop()
            await app.state.broker.stop()
            await app.state.direct.close()
            await engine.dispose()

    app = FastAPI(title="trainmaster", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.ranks = QueueRanks(settings.queue_rank_cache_jobs)
    app.state.metrics = ServiceMetrics(app.state.ranks)
    app.state.platform_snapshot = PlatformSnapshot(app.state.metrics, settings.metrics_snapshot_s)

    app.include_router(ops_router)
    app.include_router(jobs_router)
    app.include_router(code_router)
    app.include_router(metrics_router)
    app.include_router(logs_router)
    app.include_router(checkpoints_router)
    app.include_router(cluster_router)
    app.include_router(sweeps_router)
    app.include_router(clusters_router)
    app.include_router(projects_router)
    app.include_router(queues_router)
    app.include_router(usage_router)
    app.include_router(storage_router)
    app.include_router(tokens_router)
    app.include_router(ui_router)
    app.mount(UI_PREFIX, static_files(), name="ui")

    _install_error_handlers(app)
    app.add_middleware(FastLane)  # innermost: after the request metrics and the body limit
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(BodyLimitMiddleware, limit_for_path=_body_limits(settings))
    app.add_middleware(UiSecurityHeaders)
    return app


def _body_limits(settings: Settings) -> Callable[[str], int]:
    def limit_for_path(path: str) -> int:
        return settings.max_code_bytes if path.startswith("/v1/code") else settings.max_body_bytes

    return limit_for_path


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def domain_error(_: Request, exc: DomainError) -> JSONResponse:
        return domain_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return request_invalid_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "NotFound", 405: "MethodNotAllowed"}
        return error_response(exc.status_code, names.get(exc.status_code, "HTTPError"), exc.detail, exc.headers)

    async def database_down(_: Request, exc: Exception) -> JSONResponse:
        return database_unavailable(exc)

    for exc_type in DATABASE_DOWN:
        app.add_exception_handler(exc_type, database_down)

    @app.exception_handler(DBAPIError)
    async def dbapi_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return await database_down(request, exc)
        raise exc


def app_factory() -> FastAPI:
    """Entry point for `uvicorn --factory api.app:app_factory`: one app per process, its start-up heap
    frozen (not in create_app: a test process builds many apps, and frozen objects are never freed)."""
    app = create_app()
    freeze_startup_heap()
    return app
