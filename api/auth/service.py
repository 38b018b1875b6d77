"""Bearer tokens: random, shown once, stored as SHA-256 (they carry 256 bits, so no slow hash is needed)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import repository
from api.errors import Unauthorized

TOKEN_PREFIX = "tm_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a project, and for a job-scoped token the one job it may write."""

    project_id: uuid.UUID
    project_name: str
    job_id: uuid.UUID | None = None
    token_id: uuid.UUID | None = None

    @property
    def is_job_token(self) -> bool:
        return self.job_id is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


async def create_project_token(session: AsyncSession, project_name: str, description: str | None = None) -> str:
    project = await repository.get_or_create_project(session, project_name)
    token = new_token()
    await repository.add_token(session, project_id=project.id, token_hash=hash_token(token), description=description)
    return token


async def create_job_token(session: AsyncSession, project_id: uuid.UUID, job_id: uuid.UUID) -> str:
    token = new_token()
    await repository.add_token(
        session, project_id=project_id, job_id=job_id, token_hash=hash_token(token), description="job"
    )
    return token


async def create_job_tokens(session: AsyncSession, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> list[str]:
    """`create_job_token` for many (project id, job id) pairs, written in one statement."""
    tokens = [new_token() for _ in jobs]
    rows = [
        {"project_id": project_id, "job_id": job_id, "token_hash": hash_token(token), "description": "job"}
        for (project_id, job_id), token in zip(jobs, tokens, strict=True)
    ]
    await repository.add_tokens(session, rows)
    return tokens


async def authenticate(session: AsyncSession, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    found = await repository.find_active_token(session, hash_token(token.strip()))
    if found is None:
        raise Unauthorized("unknown or revoked token: create one with `trainmaster token create`")
    row, project = found
    return Principal(project_id=project.id, project_name=project.name, job_id=row.job_id, token_id=row.id)
