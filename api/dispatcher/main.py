"""`trainmaster dispatcher`: wake on NOTIFY (poll as the fallback), admit, launch, reconcile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time

import psycopg

from api.checkpoints import lifecycle
from api.db.session import create_engine, session_factory
from api.dispatcher.backend import RayBackend
from api.dispatcher.faults import with_faults
from api.dispatcher.ray_jobs import RayJobsBackend
from api.dispatcher.service import Dispatcher, freeze_heap
from api.jobs.status import JOB_CHANNEL
from api.settings import Settings, get_settings, libpq_url
from api.sweeps.controller import sweep_round
from api.telemetry.service import start_telemetry

log = logging.getLogger("trainmaster.dispatcher")


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
            log.warning(json.dumps({"event": "listen_failed", "error": str(exc)[:200]}))
            self.connection = None
            await asyncio.sleep(timeout)  # fall back to polling until PostgreSQL answers again
            return False

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


async def run(settings: Settings | None = None, backend: RayBackend | None = None) -> None:
    settings = settings or get_settings()
    owner = settings.dispatcher_id or f"{socket.gethostname()}-{os.getpid()}"
    engine = create_engine(settings)
    ray_jobs = None  # the backend made here, closed at the end (a given one is its caller's)
    if backend is None:
        backend = ray_jobs = RayJobsBackend(settings.ray_address)
    dispatcher = Dispatcher(
        settings=settings,
        sessions=session_factory(engine),
        ray=with_faults(backend),
        owner=owner,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    wakeup = Wakeup(settings.database_url)
    telemetry = start_telemetry(settings, "trainmaster-dispatcher")  # OpenTelemetry / MLflow, when configured
    freeze_heap()
    log.info(json.dumps({"event": "dispatcher_started", "owner": owner, "ray": settings.ray_address}))
    # Beside the rounds, not in them: a pass's query (1.8 s at 1,000,000 checkpoints) never holds one up.
    collector = asyncio.create_task(
        lifecycle.collect_every(dispatcher.sessions, settings.storage_path, settings.checkpoint_gc_interval_s, stopping)
    )
    try:
        while not stopping.is_set():
            started = time.monotonic()
            try:
                await sweep_round(dispatcher.sessions)  # stops losing trials, queues new ones; never asks Ray
                await dispatcher.reconcile_round()
                await dispatcher.admit_round()
            except Exception as exc:  # one bad round must not end the dispatcher
                log.exception(json.dumps({"event": "round_failed", "error": str(exc)[:300]}))
            spent = time.monotonic() - started
            waiter = asyncio.ensure_future(wakeup.wait(max(0.05, settings.poll_interval_s - spent)))
            stop_waiter = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            for task in (waiter, stop_waiter):
                task.cancel()
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        await telemetry.stop()
        await wakeup.close()
        await engine.dispose()
        if ray_jobs is not None:
            ray_jobs.close()
        log.info(json.dumps({"event": "dispatcher_stopped", "owner": owner}))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(run())
