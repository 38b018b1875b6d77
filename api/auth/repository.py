from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

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


async def add_tokens(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Token rows (project_id, job_id, token_hash, description) in one INSERT."""
    if rows:
        await session.execute(insert(ApiToken).values(list(rows)))


async def find_active_token(session: AsyncSession, token_hash: str) -> tuple[ApiToken, Project] | None:
    result = await session.execute(
        select(ApiToken, Project)
        .join(Project, Project.id == ApiToken.project_id)
        .where(ApiToken.token_hash == token_hash, ApiToken.revoked_at.is_(None))
    )
    row = result.first()
    return (row[0], row[1]) if row else None
