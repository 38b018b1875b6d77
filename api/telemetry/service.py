"""Telemetry export for the API and the dispatcher: OpenTelemetry (platform metrics, chosen jobs' training
metrics, a trace per job) and the MLflow mirror, both followed from the database.

Every API replica and dispatcher may run this, but only one process exports at a time: the holder of a
PostgreSQL advisory lock, kept on a connection of its own. So each observation, trace and mirrored point
leaves once however many replicas run; when the holder dies its connection closes, the lock frees, and
another process takes over from the rows it then finds new (points committed during the hand-over may
be missed: telemetry, not bookkeeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from api.db.session import create_engine, session_factory
from api.settings import Settings, libpq_url
from api.telemetry import repository as repo
from api.telemetry.repository import ExportedPoint, Gauges, JobTimeline

if TYPE_CHECKING:
    from api.telemetry.mlflow import MlflowMirror
    from api.telemetry.otel import OtelExport

log = logging.getLogger("trainmaster.telemetry")

EXPORT_LOCK = 0x746D5F74656C  # "tm_tel": one exporting process per database
ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
SETTLE_ROUNDS = 3


def otel_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The standard switch: an OTLP endpoint set, and the SDK not disabled."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class Cursor:
    """Rows with ids past `floor`, each handed out once although ids may commit out of order: a seen id
    keeps the floor below it for SETTLE_ROUNDS rounds, so a lower id committed meanwhile is still found."""

    def __init__(self, floor: int):
        self.floor = floor
        self.seen: dict[int, int] = {}
        self.round = 0

    @property
    def skip(self) -> list[int]:
        return list(self.seen)

    def done(self, ids: list[int]) -> None:
        for row_id in ids:
            self.seen[row_id] = self.round

    def tick(self) -> None:
        self.round += 1
        settled = [row_id for row_id, seen_at in self.seen.items() if self.round - seen_at >= SETTLE_ROUNDS]
        if settled:
            self.floor = max(self.floor, *settled)
            self.seen = {row_id: seen_at for row_id, seen_at in self.seen.items() if row_id > self.floor}


class Telemetry:
    def __init__(
        self,
        settings: Settings,
        service_name: str,
        *,
        environ: Mapping[str, str] | None = None,
        replay: bool = False,
    ):
        environ = os.environ if environ is None else environ
        self.settings = settings
        self.replay = replay  # start from the first row instead of the newest (tests)
        self.engine: AsyncEngine | None = None
        self.sessions: async_sessionmaker | None = None
        self.lock_connection: psycopg.AsyncConnection | None = None  # holds the export lock
        self.candidate: psycopg.AsyncConnection | None = None  # asks for it, while another process holds it
        self.gauges: Gauges | None = None
        self.otel: OtelExport | None = None
        self.mlflow: MlflowMirror | None = None
        self.events, self.otel_points, self.mlflow_points = Cursor(0), Cursor(0), Cursor(0)
        if otel_enabled(environ):
            from api.telemetry.otel import OtelExport

            self.otel = OtelExport(service_name, gauges=lambda: self.gauges if self.leading else None)
        if settings.mlflow_tracking_uri:
            from api.telemetry.mlflow import MlflowMirror

            self.mlflow = MlflowMirror(settings.mlflow_tracking_uri, environ)
        self.task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.otel is not None or self.mlflow is not None

    @property
    def leading(self) -> bool:
        return self.lock_connection is not None and not self.lock_connection.closed

    def start(self) -> Telemetry:
        if self.active:
            self.engine = create_engine(self.settings)
            self.sessions = session_factory(self.engine)
            self.task = asyncio.create_task(self._loop(), name="trainmaster-telemetry")
        return self

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.leading:
            with contextlib.suppress(Exception):
                await self.round()  # what happened since the last round
        if self.otel is not None:
            await asyncio.to_thread(self.otel.shutdown)  # flushes the spans and metrics still held
        if self.mlflow is not None:
            await self.mlflow.close()
        for connection in (self.lock_connection, self.candidate):
            if connection is not None:
                await connection.close()
        if self.engine is not None:
            await self.engine.dispose()

    async def _loop(self) -> None:
        while True:
            try:
                if await self.lead():
                    await self.round()
            except Exception as exc:  # a bad round (database away, exporter down) must not end the loop
                log.warning("telemetry_round_failed", extra={"error": str(exc)[:300]})
            await asyncio.sleep(self.settings.telemetry_interval_s)

    async def lead(self) -> bool:
        """Whether this process exports: it holds the advisory lock (checked alive each round, so a
        connection PostgreSQL dropped, and with it the lock, is noticed), or takes it now."""
        if self.leading:
            assert self.lock_connection is not None
            try:
                await self.lock_connection.execute("SELECT 1")
                return True
            except psycopg.Error:
                await self.lock_connection.close()  # the lock went with the connection
        self.lock_connection = None
        if self.candidate is None or self.candidate.closed:
            self.candidate = await psycopg.AsyncConnection.connect(
                libpq_url(self.settings.database_url), autocommit=True
            )
        try:
            row = await (await self.candidate.execute("SELECT pg_try_advisory_lock(%s)", (EXPORT_LOCK,))).fetchone()
        except psycopg.Error:
            await self.candidate.close()
            raise
        if not (row and row[0]):
            return False
        self.lock_connection, self.candidate = self.candidate, None
        assert self.sessions is not None
        async with self.sessions() as session:
            events = 0 if self.replay else await repo.max_event_id(session)
            points = 0 if self.replay else await repo.max_metric_seq(session)
        self.events, self.otel_points, self.mlflow_points = Cursor(events), Cursor(points), Cursor(points)
        log.info("telemetry_exporting", extra={"otel": self.otel is not None, "mlflow": bool(self.mlflow)})
        return True

    async def round(self) -> None:
        """Export what is new since the last round."""
        assert self.sessions is not None
        async with self.sessions() as session:
            self.gauges = await repo.gauges(session)
            observations = await repo.observations_after(session, self.events.floor, self.events.skip)
            label = None
            otel_points: list[ExportedPoint] = []
            if self.otel is not None:
                from api.telemetry.otel import JOB_METRICS_LABEL

                label = dict([JOB_METRICS_LABEL])
                otel_points = await repo.points_after(session, self.otel_points.floor, self.otel_points.skip, label)
            mlflow_points = (
                await repo.points_after(session, self.mlflow_points.floor, self.mlflow_points.skip, None)
                if self.mlflow is not None
                else []
            )
            ended = {o.job_id for o in observations if o.figure == "duration"}
            wanted = ended | {p.job_id for p in otel_points} | {p.job_id for p in mlflow_points}
            timelines = {t.id: t for t in await repo.timelines(session, list(wanted))}
        if self.otel is not None:
            for observation in observations:
                self.otel.observe(observation)
            for point in otel_points:
                job = timelines[point.job_id]
                attributes: dict[str, str | int] = {
                    "trainmaster.job.id": str(job.id),
                    "trainmaster.job.name": job.name,
                    "project": job.project,
                    "rank": point.rank,
                }
                self.otel.job_metric(point.name, point.value, attributes)
            for job_id in ended:
                self.otel.trace(timelines[job_id])
            self.otel_points.done([p.seq for p in otel_points])
        if self.mlflow is not None:
            await self._mirror(timelines, mlflow_points, ended)
        self.events.done([o.id for o in observations])
        for cursor in (self.events, self.otel_points, self.mlflow_points):
            cursor.tick()

    async def _mirror(
        self, timelines: dict[uuid.UUID, JobTimeline], points: list[ExportedPoint], ended: set[uuid.UUID]
    ) -> None:
        """Each job's points, then its final status; a job whose mirror fails is retried next round."""
        assert self.mlflow is not None
        by_job: dict[uuid.UUID, list[ExportedPoint]] = {}
        for point in points:
            by_job.setdefault(point.job_id, []).append(point)
        for job_id in by_job.keys() | ended:
            try:
                if by_job.get(job_id):
                    await self.mlflow.log_points(timelines[job_id], by_job[job_id])
                    self.mlflow_points.done([p.seq for p in by_job[job_id]])
                if job_id in ended:
                    await self.mlflow.finish(timelines[job_id])
            except Exception as exc:
                log.warning("mlflow_mirror_failed", extra={"job_id": str(job_id), "error": str(exc)[:300]})


def start_telemetry(settings: Settings, service_name: str) -> Telemetry:
    """Starts exporting when OTEL_EXPORTER_OTLP_ENDPOINT or TRAINMASTER_MLFLOW_TRACKING_URI is set; a no-op
    otherwise. Call from a running event loop; `await telemetry.stop()` flushes at shutdown."""
    return Telemetry(settings, service_name).start()
