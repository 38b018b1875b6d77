"""Tokens made outside a request (the `token create` verb, the test suite): one engine, one commit."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.service import create_job_token, create_project_token
from api.db.models import Job
from api.db.session import create_engine, session_factory
from api.settings import Settings

T = TypeVar("T")


def _in_transaction(database_url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    async def run() -> T:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session:
                result = await work(session)
                await session.commit()
                return result
        finally:
            await engine.dispose()

    return asyncio.run(run())


def project_token(database_url: str, project: str, description: str | None = None) -> str:
    """A new token of `project` (created if new); shown only this once, stored hashed."""
    return _in_transaction(database_url, lambda session: create_project_token(session, project, description))


def job_token(database_url: str, job_id: str) -> str:
    """A job-scoped token, as the dispatcher makes for each attempt."""

    async def make(session: AsyncSession) -> str:
        job = await session.get(Job, uuid.UUID(job_id))
        if job is None:
            raise LookupError(f"no job {job_id}")
        return await create_job_token(session, job.project_id, job.id)

    return _in_transaction(database_url, make)
