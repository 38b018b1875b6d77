"""Fan-out of PostgreSQL NOTIFY to the streams of this API process, and token revocations to its cache.

One LISTEN connection per process (per uvicorn worker) serves every stream; a notification only says
"job X has something new", and each stream reads what it has not sent yet by sequence number. So a
lost or coalesced notification, or a reconnect, never loses data: on reconnect every stream re-reads.
The same connection hears `tm_queue` (a job entered or left the queue: api/queues/ranks.py, held to the
same rules) and `tm_auth` (a token revoked, api/auth/cache.py): the token cache is trusted
only while this connection is up, is emptied whenever it is lost or made again, and a cached token is
used only after a round trip on this connection that began after the request arrived (`synced`), so
a revocation committed before the request is always handled first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.generators import notifies

from api.auth.cache import TokenCache
from api.jobs.status import JOB_CHANNEL
from api.queues.ranks import QueueRanks
from api.settings import libpq_url

log = logging.getLogger("trainmaster.api.broker")

METRICS_CHANNEL = "tm_metrics"
LOGS_CHANNEL = "tm_logs"
AUTH_CHANNEL = "tm_auth"  # migration 0006: the hash of a revoked or deleted token, or "*"
QUEUE_CHANNEL = "tm_queue"  # migration 0008: a job entered or left the queue (api/queues/ranks.py)
CHANNELS = (JOB_CHANNEL, METRICS_CHANNEL, LOGS_CHANNEL, AUTH_CHANNEL, QUEUE_CHANNEL)


class Broker:
    def __init__(self, database_url: str, tokens: TokenCache | None = None, ranks: QueueRanks | None = None):
        self.database_url = libpq_url(database_url)
        self.waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self.task: asyncio.Task[None] | None = None
        self.tokens = tokens or TokenCache(0)
        self.tokens.synced = self.synced
        self.ranks = ranks or QueueRanks(0)
        self.ranks.synced_since = self.synced_since
        self.round_trip_began = -1.0  # loop time at which the last answered sync round trip was sent
        self.sync_wanted = asyncio.Event()
        self.sync_waiters: list[asyncio.Future[None]] = []

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

    async def synced(self, timeout_s: float = 1.0) -> bool:
        """Wait until every notice committed before this call has been handled; False if that cannot
        be known now (not listening, or no answer in `timeout_s`).

        A round trip on the LISTEN connection started after the call: PostgreSQL sends a listening
        session the notices committed before a command ahead of that command's answer. Callers that
        arrive together share one round trip."""
        if not self.tokens.listening:
            return False
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sync_waiters.append(done)
        self.sync_wanted.set()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout_s)
            return True
        except (asyncio.TimeoutError, psycopg.Error):
            return False

    async def synced_since(self, since: float, timeout_s: float = 1.0) -> bool:
        """`synced`, unless a round trip sent at or after `since` (the loop's clock) has been answered
        already: requests share the one the token cache made for them."""
        if self.tokens.listening and self.round_trip_began >= since:
            return True
        return await self.synced(timeout_s)

    def _wake(self, job_id: str | None) -> None:
        targets = self.waiters.get(job_id, ()) if job_id else [e for es in self.waiters.values() for e in es]
        for event in targets:
            event.set()

    def _on_notify(self, notice: psycopg.Notify) -> None:
        if notice.channel == AUTH_CHANNEL:
            self.tokens.revoked(notice.payload)
        elif notice.channel == QUEUE_CHANNEL:
            self.ranks.moved(notice.payload)
        else:
            self._wake(_job_of(notice.payload))

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Handle notices until a sync is wanted, then answer every sync asked for so far."""
        while True:
            self.sync_wanted.clear()
            idle = asyncio.ensure_future(self._read(conn))
            wanted = asyncio.ensure_future(self.sync_wanted.wait())
            try:
                await asyncio.wait({idle, wanted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (idle, wanted):
                    task.cancel()
                await asyncio.gather(idle, wanted, return_exceptions=True)
            if idle.done() and not idle.cancelled() and idle.exception() is not None:
                raise idle.exception()  # type: ignore[misc]
            if not self.sync_waiters:
                continue
            waiting, self.sync_waiters = self.sync_waiters, []
            began = asyncio.get_running_loop().time()
            try:
                await conn.execute("SELECT 1")  # notices ahead of its answer are handled on the way
            except BaseException as exc:
                for done in waiting:
                    if not done.done():
                        done.set_exception(psycopg.OperationalError("listener lost"))
                raise exc
            self.round_trip_began = began
            for done in waiting:
                if not done.done():
                    done.set_result(None)

    @staticmethod
    async def _read(conn: psycopg.AsyncConnection[Any]) -> None:
        """Handle notices (conn's handler: _on_notify) until cancelled. One task for all of them: a task
        pair per notice, set up and torn down, cost the API about 10% of its CPU under ingest load,
        which sends one notice per batch."""
        while True:
            await conn.wait(notifies(conn.pgconn))

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.database_url, autocommit=True) as conn:
                    conn.add_notify_handler(self._on_notify)
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {channel}")
                    backoff = 0.2
                    self.tokens.listener_up()
                    self.ranks.listener_up()
                    self._wake(None)  # anything sent while we were away is read now
                    await self._listen(conn)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                log.warning("listen_lost", extra={"error": str(exc)[:200], "retry_in_s": backoff})
                self.tokens.listener_down()
                self.ranks.listener_down()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self._wake(None)
            finally:
                self.tokens.listener_down()
                self.ranks.listener_down()
                for done in self.sync_waiters:
                    if not done.done():
                        done.set_exception(psycopg.OperationalError("listener lost"))
                self.sync_waiters = []


def _job_of(payload: str) -> str | None:
    if payload.startswith("{"):
        try:
            return str(json.loads(payload).get("job_id"))
        except ValueError:
            return None
    return payload or None
