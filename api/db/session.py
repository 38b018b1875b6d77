"""Engine and sessions. A request's session commits once, at its edge."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from api.settings import Settings, async_url


def create_engine(settings: Settings) -> AsyncEngine:
    return create_async_engine(
        async_url(settings.database_url),
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
        pool_timeout=settings.db_connect_timeout_s,
        connect_args={"connect_timeout": max(1, int(settings.db_connect_timeout_s))},
    )


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
