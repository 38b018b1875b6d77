"""Tokens made outside a request (the `token create` verb, the test suite): one engine, one commit."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Scope
from api.auth.service import claim_job_token, create_job_token, create_project_token, create_token, expiry
from api.db.models import ClusterRow, Job
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


def token(
    database_url: str,
    project: str,
    *,
    scope: Scope = Scope.project,
    description: str | None = None,
    expires_in: timedelta | None = None,
    never: bool = False,
    user_name: str | None = None,
) -> str:
    """A new token of `scope` (project tokens live 90 days unless `expires_in` or `never` say otherwise)."""

    async def make(session: AsyncSession) -> str:
        secret, _ = await create_token(
            session,
            project,
            scope=scope,
            description=description,
            expires_at=expiry(scope, expires_in, never=never),
            user_name=user_name,
        )
        return secret

    return _in_transaction(database_url, make)


def point_cluster(database_url: str, name: str, address: str, token_file: str | None) -> None:
    """Point the cluster `name` at a Ray address and token file, adding it when there is none
    (`trainmaster up`: `default`, made by migration 0013, is its own Ray head; `cluster-2` … its others)."""

    async def change(session: AsyncSession) -> None:
        values = {"address": address, "token_file": token_file, "token_env": None}
        row = {"id": uuid.uuid4(), "name": name, **values}
        await session.execute(
            insert(ClusterRow).values(**row).on_conflict_do_update(index_elements=["name"], set_=values)
        )

    _in_transaction(database_url, change)


def job_token(database_url: str, job_id: str) -> str:
    """A job-scoped token, as the dispatcher makes for each attempt and its driver claims."""

    async def make(session: AsyncSession) -> str:
        job = await session.get(Job, uuid.UUID(job_id))
        if job is None:
            raise LookupError(f"no job {job_id}")
        claim = await create_job_token(session, job.project_id, job.id)
        return await claim_job_token(session, job_id, claim, ttl_s=60)

    return _in_transaction(database_url, make)
