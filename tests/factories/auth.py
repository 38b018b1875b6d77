"""Tokens made through the real auth service, as `trainmaster token create` makes them."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import admin
from api.auth.principal import Scope
from api.auth.service import create_job_token
from api.db.models import Job


def project_token(database_url: str, project: str = "alpha") -> str:
    return admin.project_token(database_url, project)


def job_token(database_url: str, job_id: str) -> str:
    return admin.job_token(database_url, job_id)


def scoped_token(database_url: str, project: str = "default", scope: str = "admin", **options: Any) -> str:
    """A token of `scope` (admin, project, metrics), as `trainmaster token create --scope` makes it."""
    return admin.token(database_url, project, scope=Scope(scope), **options)


def job_claim(database_url: str, job_id: str) -> str:
    """A job token's claim, as an admission round writes it into a launch (not yet exchanged)."""

    async def make(session: AsyncSession) -> str:
        job = await session.get(Job, uuid.UUID(job_id))
        assert job is not None, job_id
        return await create_job_token(session, job.project_id, job.id)

    return admin._in_transaction(database_url, make)
