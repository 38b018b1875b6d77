"""Fan-out of PostgreSQL NOTIFY to the streams of this API process.

One LISTEN connection per process serves every stream; a notification only says "job X has
something new", and each stream reads what it has not sent yet by sequence number. So a lost or
coalesced notification, or a reconnect, never loses data: on reconnect every stream re-reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator

import psycopg

from api.jobs.status import JOB_CHANNEL
from api.settings import libpq_url

log = logging.getLogger("trainmaster.api.broker")

METRICS_CHANNEL = "tm_metrics"
LOGS_CHANNEL = "tm_logs"
CHANNELS = (JOB_CHANNEL, METRICS_CHANNEL, LOGS_CHANNEL)


class Broker:
    def __init__(self, database_url: str):
        self.database_url = libpq_url(database_url)
        self.waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="notify-broker")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever job `job_id` has news (status, metrics or logs)."""
        self.start()
        event = asyncio.Event()
        self.waiters[job_id].add(event)
        try:
            yield event
        finally:
            self.waiters[job_id].discard(event)
            if not self.waiters[job_id]:
                del self.waiters[job_id]

    def _wake(self, job_id: str | None) -> None:
        targets = self.waiters.get(job_id, ()) if job_id else [e for es in self.waiters.values() for e in es]
        for event in targets:
            event.set()

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.database_url, autocommit=True) as conn:
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {channel}")
                    backoff = 0.2
                    self._wake(None)  # anything sent while we were away is read now
                    async for notify in conn.notifies():
                        self._wake(_job_of(notify.payload))
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning(json.dumps({"event": "listen_lost", "error": str(exc)[:200], "retry_in_s": backoff}))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self._wake(None)


def _job_of(payload: str) -> str | None:
    if payload.startswith("{"):
        try:
            return str(json.loads(payload).get("job_id"))
        except ValueError:
            return None
    return payload or None
