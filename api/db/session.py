"""Engine and sessions. A request's session commits once, at its edge."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from api.settings import Settings, async_url

PING_IDLE_S = 1.0  # a pooled connection unused this long is pinged before use


def create_engine(settings: Settings) -> AsyncEngine:
    engine = create_async_engine(
        async_url(settings.database_url),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_timeout=settings.db_connect_timeout_s,
        connect_args={"connect_timeout": max(1, int(settings.db_connect_timeout_s))},
    )
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: AsyncEngine) -> None:
    """pool_pre_ping, but only for connections that sat in the pool PING_IDLE_S or more.

    A busy pool hands out connections used milliseconds ago; asking each time whether PostgreSQL is
    still there was one of a submit's five round trips. A connection broken while in use
    fails its request (503) and invalidates the pool, so the rest are replaced; one left idle across
    a restart is found out by the ping and replaced before the request sees it."""
    pool = engine.sync_engine.pool

    @event.listens_for(pool, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("checked_in_at", 0.0) < PING_IDLE_S:
            return
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute("SELECT 1")
            cursor.close()
            # Not left in the transaction the SELECT opened: a checkout must be idle, or setting
            # AUTOCOMMIT on it fails ("can't change 'autocommit' now": every admission round failed
            # on the dispatcher's first round after an idle second).
            dbapi_connection.rollback()
        except Exception as exc:
            raise DisconnectionError(str(exc)) from exc  # the pool retries with a new connection


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def db_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session per request: committed after the handler returns, rolled back on any error."""
    factory: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with factory() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


# scope="function": the session commits before the response is sent, so a 2xx means committed,
# and streaming responses do not hold a connection for their whole life.
Session = Annotated[AsyncSession, Depends(db_session, scope="function")]
