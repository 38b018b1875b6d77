"""Plain psycopg connections for the hottest requests, beside SQLAlchemy's engine.

A request that is one statement (check a token, read a job, submit a job) needs no ORM session. Such a
statement is written once, in psycopg's `%(name)s` style, and runs either here or inside a session's
transaction (`OnSession`, for callers that write more in the same transaction): the same text reaches
the driver either way, nothing rewrites it. On
this project's 2-core machine an `AsyncSession` cost about 650 µs of CPU for a `SELECT 1` in a
transaction, psycopg on an autocommit connection 85 µs (the figures are in bench/README.md). These
connections autocommit: every statement is its own transaction, so a path that writes several rows
does it in one statement (a CTE), which commits as a whole or not at all.

Connections that sat idle for PING_IDLE_S are pinged before use, as the engine's are
(api/db/session.py): one left broken by a PostgreSQL restart is replaced before a request sees it; one
broken while in use fails its request with 503 and is discarded when it comes back to the pool.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.session import PING_IDLE_S
from api.settings import Settings, libpq_url

# psycopg prepares a statement on a connection once it has run 5 times there; PostgreSQL then plans it
# again for every execution ("custom" plans) unless a generic plan looks as cheap. For READ_JOB with a
# known count that never happens (the generic plan carries the count it skips: COALESCE's other
# branch), and planning it costs more than running it. These statements are short index
# lookups whose best plan does not depend on the values: always the generic plan (bench/README.md).
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"


class Runner(Protocol):
    """Runs one statement (psycopg's `%(name)s` binds): `Direct` or `OnSession`."""

    async def one(self, query: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None: ...

    async def all(self, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...


class OnSession:
    """A session's connection, inside its transaction, as a `Runner`: the SQL text goes to the driver as
    written (`exec_driver_sql`), so it is the same statement the direct pool runs."""

    def __init__(self, session: AsyncSession):
        self.session = session

    async def one(self, query: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        connection = await self.session.connection()
        row = (await connection.exec_driver_sql(query, dict(params))).first()
        return None if row is None else tuple(row)

    async def all(self, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        connection = await self.session.connection()
        return [tuple(row) for row in (await connection.exec_driver_sql(query, dict(params))).all()]


class Direct:
    """A pool of autocommit psycopg connections (at most `db_pool_size`), opened with the app."""

    def __init__(self, settings: Settings):
        self._returned: dict[int, float] = {}  # id(connection) -> when it came back to the pool
        self.pool = AsyncConnectionPool(
            libpq_url(settings.database_url),
            min_size=1,
            max_size=settings.db_pool_size,
            timeout=settings.db_connect_timeout_s,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, int(settings.db_connect_timeout_s)),
                "options": GENERIC_PLANS,
            },
            check=self._check,
            reset=self._reset,
            open=False,
            name="trainmaster-direct",
        )

    async def open(self) -> None:
        await self.pool.open(wait=False)  # PostgreSQL may be down at start: requests answer 503 until it is up

    async def close(self) -> None:
        await self.pool.close()

    async def _check(self, connection: AsyncConnection[Any]) -> None:
        if time.monotonic() - self._returned.get(id(connection), 0.0) >= PING_IDLE_S:
            await connection.execute("")  # raises on a broken connection: the pool takes another

    async def _reset(self, connection: AsyncConnection[Any]) -> None:
        self._returned[id(connection)] = time.monotonic()

    async def one(self, query: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row of one statement, or None."""
        async with self.pool.connection() as connection:
            cursor = await connection.execute(query, params)
            return await cursor.fetchone()

    async def all(self, query: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row of one statement."""
        async with self.pool.connection() as connection:
            cursor = await connection.execute(query, params)
            return await cursor.fetchall()
