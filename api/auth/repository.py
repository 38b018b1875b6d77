from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct
from api.db.models import ApiToken, Project


async def get_or_create_project(session: AsyncSession, name: str) -> Project:
    await session.execute(insert(Project).values(id=uuid.uuid4(), name=name).on_conflict_do_nothing())
    return (await session.execute(select(Project).where(Project.name == name))).scalar_one()


async def add_token(
    session: AsyncSession,
    *,
    project_id: uuid.UUID,
    token_hash: str,
    job_id: uuid.UUID | None = None,
    description: str | None = None,
) -> ApiToken:
    row = ApiToken(project_id=project_id, token_hash=token_hash, job_id=job_id, description=description)
    session.add(row)
    await session.flush()
    return row


# Who an active token belongs to: (token id, job id, project id, project name), on a direct connection.
FIND_ACTIVE_TOKEN = """
    SELECT t.id, t.job_id, p.id, p.name FROM api_tokens t JOIN projects p ON p.id = t.project_id
    WHERE t.token_hash = %(hash)s AND t.revoked_at IS NULL
"""


async def find_active_token(direct: Direct, token_hash: str) -> tuple[Any, ...] | None:
    return await direct.one(FIND_ACTIVE_TOKEN, {"hash": token_hash})
