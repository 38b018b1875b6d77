"""Bearer tokens: random, shown once, stored as SHA-256 (they carry 256 bits, so no slow hash is needed)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import repository
from api.auth.principal import Principal
from api.errors import Unauthorized

if TYPE_CHECKING:
    from api.auth.cache import TokenCache
    from api.db.direct import Direct

TOKEN_PREFIX = "tm_"


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


async def authenticate(direct: Direct, authorization: str | None, cache: TokenCache | None = None) -> Principal:
    """Who sent `Authorization: Bearer <token>`; with a cache, a token checked moments ago and not
    revoked since is not looked up again (api/auth/cache.py)."""
    if not authorization:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    token_hash = hash_token(token.strip())
    if cache is not None and (principal := await cache.get(token_hash)) is not None:
        return principal
    stamp = cache.stamp() if cache is not None else None
    found = await repository.find_active_token(direct, token_hash)
    if found is None:
        raise Unauthorized("unknown or revoked token: create one with `trainmaster token create`")
    token_id, job_id, project_id, project_name = found
    principal = Principal(project_id=project_id, project_name=project_name, job_id=job_id, token_id=token_id)
    if cache is not None and stamp is not None:
        cache.put(token_hash, principal, stamp)
    return principal
