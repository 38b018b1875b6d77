"""`trainmaster dispatcher`: wake on NOTIFY (poll as the fallback), admit, launch, reconcile, for every
cluster of the `clusters` table, each in rounds of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass

import psycopg

from api.auth.repository import DEFAULT_CLUSTER
from api.clusters import repository as clusters_repo
from api.clusters import service as clusters
from api.db.models import ClusterRow
from api.db.session import create_engine, session_factory
from api.dispatcher import checkpoint_collector
from api.dispatcher.backend import RayBackend
from api.dispatcher.faults import with_faults
from api.dispatcher.ray_jobs import RayJobsBackend
from api.dispatcher.service import Dispatcher
from api.jobs.status import JOB_CHANNEL
from api.ops.heap import freeze_startup_heap
from api.settings import Settings, get_settings, libpq_url
from api.sweeps.controller import sweep_round
from api.telemetry.service import start_telemetry
from trainmaster import json_logs

log = logging.getLogger("trainmaster.dispatcher")

CLUSTERS_EVERY_S = 10.0  # how often the clusters table is read for clusters added since


class Wakeup:
    """Sleeps until a NOTIFY on the jobs channel or the poll interval, whichever comes first."""

    def __init__(self, database_url: str):
        self.database_url = libpq_url(database_url)
        self.connection: psycopg.AsyncConnection | None = None

    async def wait(self, timeout: float) -> bool:
        try:
            if self.connection is None or self.connection.closed:
                self.connection = await psycopg.AsyncConnection.connect(self.database_url, autocommit=True)
                await self.connection.execute(f"LISTEN {JOB_CHANNEL}")
            async for _ in self.connection.notifies(timeout=timeout, stop_after=1):
                return True
            return False
        except (psycopg.Error, OSError) as exc:
            log.warning("listen_failed", extra={"error": str(exc)[:200]})
            self.connection = None
            await asyncio.sleep(timeout)  # fall back to polling until PostgreSQL answers again
            return False

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


@dataclass
class Serving:
    """One cluster this dispatcher serves: its rounds (a `Dispatcher` on that cluster's Ray) in a task of
    their own, woken by `kick`, so a slow or unreachable cluster delays only its own jobs."""

    dispatcher: Dispatcher
    kick: asyncio.Event
    task: asyncio.Task[None]
    backend: RayJobsBackend | None  # made here, closed at the end (a given backend is its caller's)


async def run(settings: Settings | None = None, backend: RayBackend | None = None) -> None:
    """Serve every cluster of the `clusters` table (new records are picked up within CLUSTERS_EVERY_S).
    `backend`, when given, is the Ray of the cluster `default` (tests)."""
    settings = settings or get_settings()
    owner = settings.dispatcher_id or f"{socket.gethostname()}-{os.getpid()}"
    engine = create_engine(settings)
    sessions = session_factory(engine)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    wakeup = Wakeup(settings.database_url)
    telemetry = start_telemetry(settings, "trainmaster-dispatcher")  # OpenTelemetry / MLflow, when configured
    serving: dict[uuid.UUID, Serving] = {}
    refused: dict[uuid.UUID, tuple[str | None, str | None]] = {}  # cluster -> the token source it was refused for

    def serve(row: ClusterRow) -> None:
        ray: RayBackend
        made: RayJobsBackend | None = None
        if backend is not None and row.name == DEFAULT_CLUSTER:
            ray = backend
        else:
            try:
                ray = made = clusters.backend_for(row, settings.ray_address, secrets_path=settings.secrets_path)
            except clusters.TokenSourceRefused as exc:  # tried again at each read of the table, said once
                if refused.get(row.id) != (row.token_file, row.token_env):
                    refused[row.id] = (row.token_file, row.token_env)
                    log.error("cluster_token_source_refused", extra={"cluster": row.name, "error": str(exc)})
                return
        dispatcher = Dispatcher(
            settings=settings,
            sessions=sessions,
            ray=with_faults(ray),
            owner=owner,
            cluster_id=row.id,
            cluster_name=row.name,
        )
        kick = asyncio.Event()
        task = asyncio.create_task(_rounds(dispatcher, kick, stopping), name=f"cluster {row.name}")
        serving[row.id] = Serving(dispatcher, kick, task, made)
        log.info(
            "cluster_served",
            extra={
                "owner": owner,
                "cluster": row.name,
                "ray": made.address if made is not None else "the given backend",
            },
        )

    freeze_startup_heap()
    log.info("dispatcher_started", extra={"owner": owner, "ray": settings.ray_address})
    # Beside the rounds, not in them: a pass's query (1.8 s at 1,000,000 checkpoints) never holds one up.
    collector = asyncio.create_task(
        checkpoint_collector.collect_every(sessions, settings.storage_path, settings.checkpoint_gc_interval_s, stopping)
    )
    clusters_read = float("-inf")
    try:
        while not stopping.is_set():
            started = time.monotonic()
            try:
                if started - clusters_read >= CLUSTERS_EVERY_S:
                    async with sessions() as session:
                        for row in await clusters_repo.list_all(session):
                            if row.id not in serving:
                                serve(row)
                    clusters_read = started
                await sweep_round(sessions)  # stops losing trials, queues new ones; never asks Ray
            except Exception as exc:  # one bad pass must not end the dispatcher
                log.exception("round_failed", extra={"error": str(exc)[:300]})
            for each in serving.values():
                each.kick.set()
            spent = time.monotonic() - started
            waiter = asyncio.ensure_future(wakeup.wait(max(0.05, settings.poll_interval_s - spent)))
            stop_waiter = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            for task in (waiter, stop_waiter):
                task.cancel()
    finally:
        stopping.set()
        for each in serving.values():
            each.kick.set()
        await asyncio.gather(*(each.task for each in serving.values()), return_exceptions=True)  # rounds end whole
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        await telemetry.stop()
        await wakeup.close()
        await engine.dispose()
        for each in serving.values():
            if each.backend is not None:
                each.backend.close()
        log.info("dispatcher_stopped", extra={"owner": owner})


async def _rounds(dispatcher: Dispatcher, kick: asyncio.Event, stopping: asyncio.Event) -> None:
    """A cluster's rounds: reconcile, then admit, each time the main loop kicks (a NOTIFY, or the poll)."""
    while not stopping.is_set():
        kick.clear()
        try:
            await dispatcher.reconcile_round()
            await dispatcher.admit_round()
        except Exception as exc:  # one bad round must not end the dispatcher
            log.exception("round_failed", extra={"cluster": dispatcher.cluster_name, "error": str(exc)[:300]})
        await kick.wait()


def main() -> None:
    json_logs.configure()
    asyncio.run(run())
