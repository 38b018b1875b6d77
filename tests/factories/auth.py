"""Tokens made through the real auth service, as `trainmaster token create` makes them."""

from __future__ import annotations

import asyncio

from api.auth.service import create_project_token
from api.db.session import create_engine, session_factory
from api.settings import Settings


def project_token(database_url: str, project: str = "alpha") -> str:
    async def run() -> str:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session:
                token = await create_project_token(session, project)
                await session.commit()
                return token
        finally:
            await engine.dispose()

    return asyncio.run(run())


def job_token(database_url: str, job_id: str) -> str:
    """A job-scoped token, as the dispatcher makes for each attempt."""
    import uuid

    from api.auth.service import create_job_token
    from api.db.models import Job

    async def run() -> str:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session:
                job = await session.get(Job, uuid.UUID(job_id))
                assert job is not None
                token = await create_job_token(session, job.project_id, job.id)
                await session.commit()
                return token
        finally:
            await engine.dispose()

    return asyncio.run(run())
