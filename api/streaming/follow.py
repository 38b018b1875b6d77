"""The shared loop behind every job stream: send what is new by sequence, then wait for news."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.auth.principal import Principal
from api.auth.watch import TokenWatch
from api.db.models import Job
from api.streaming import sse
from api.streaming.broker import Broker
from api.streaming.sse import EventStream
from trainmaster.models import JobStatus

DB_DOWN = (OperationalError, InterfaceError, DBAPIError, PoolTimeout, OSError)
outage_retry_s = 1.0

ReadAfter = Callable[[AsyncSession, uuid.UUID, int], Awaitable[tuple[list[dict[str, Any]], int]]]


async def follow(
    *,
    job_id: uuid.UUID,
    after_seq: int,
    read_after: ReadAfter,
    event_name: str,
    sessions: async_sessionmaker[AsyncSession],
    broker: Broker,
    heartbeat_s: float,
    watch: TokenWatch | None = None,
) -> AsyncIterator[bytes]:
    """Yield `event_name` events (id = last sequence in the event) as rows arrive, `status` events
    on transitions, and `end` once the job is terminal and everything before that was sent. The
    stream ends (a comment saying why, no `end`) once `watch` finds its token revoked or expired:
    checked at least every `watch.recheck_s`."""
    last = after_seq
    sent_status: JobStatus | None = None
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    async with broker.subscribe(str(job_id)) as news:
        while True:
            if watch is not None and not await watch.still_valid():
                yield sse.comment("token revoked or expired: the stream ends")
                return
            news.clear()
            try:
                async with sessions() as session:
                    # Status first, rows second: a row committed before the job became terminal is then
                    # always in the read that follows, so `end` never overtakes the last rows. (Read the
                    # other way round, a job that wrote its last rows and finished between the two reads
                    # was seen terminal with its rows never read.)
                    status = (await session.execute(select(Job.status).where(Job.id == job_id))).scalar_one()
                    items, newest = await read_after(session, job_id, last)
            except DB_DOWN:
                # Keep the stream open through a database outage; resume from `last` when it is back.
                yield sse.comment("database unavailable; retrying")
                await asyncio.sleep(outage_retry_s)
                continue
            if items:
                last = newest
                quiet_since = loop.time()
                yield sse.event(event_name, {"items": items}, event_id=newest)
                continue  # more may be waiting; read again before sleeping
            if status is not sent_status:
                sent_status = status
                quiet_since = loop.time()
                yield sse.event("status", {"status": status.value})
            if status.terminal:
                yield sse.event("end", {"status": status.value}, event_id=last)
                return
            # Wake for news, the token's next check, or the heartbeat, whichever comes first.
            wait_s = heartbeat_s - (loop.time() - quiet_since)
            if watch is not None:
                wait_s = min(wait_s, watch.recheck_s)
            try:
                await asyncio.wait_for(news.wait(), max(wait_s, 0.0))
            except asyncio.TimeoutError:
                if loop.time() - quiet_since >= heartbeat_s:
                    quiet_since = loop.time()
                    yield sse.comment("keepalive")


def last_event_id(header: str | None, query: int | None) -> int:
    if query is not None:
        return max(0, query)
    try:
        return max(0, int(header)) if header else 0
    except ValueError:
        return 0


def job_stream(
    request: Request, principal: Principal, job_id: uuid.UUID, read_after: ReadAfter, event_name: str, resume_after: int
) -> EventStream:
    """The SSE response for one job's stream, counted against its token's and its project's caps."""
    state = request.app.state
    release = state.stream_limiter.acquire(principal)
    watch = TokenWatch(state.direct, getattr(state, "tokens", None), request.headers.get("authorization"), principal)
    messages = follow(
        job_id=job_id,
        after_seq=resume_after,
        read_after=read_after,
        event_name=event_name,
        sessions=state.sessions,
        broker=state.broker,
        heartbeat_s=state.settings.sse_heartbeat_s,
        watch=watch,
    )
    return EventStream(messages, send_timeout_s=state.settings.sse_send_timeout_s, on_close=release)
