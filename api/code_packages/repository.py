from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct
from api.db.models import CodePackage


async def store(session: AsyncSession, project_id: uuid.UUID, code_id: str, content: bytes, file_count: int) -> None:
    """Insert the package; uploading it again restarts its retention clock (created_at), so a package
    just re-uploaded for a new job is not purged before that job is submitted."""
    statement = insert(CodePackage).values(
        project_id=project_id, id=code_id, size=len(content), file_count=file_count, content=content
    )
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[CodePackage.project_id, CodePackage.id], set_={"created_at": func.now()}
        )
    )


async def exists(session: AsyncSession, project_id: uuid.UUID, code_id: str) -> bool:
    query = select(CodePackage.id).where(CodePackage.project_id == project_id, CodePackage.id == code_id)
    return (await session.execute(query)).scalar_one_or_none() is not None


async def exists_direct(direct: Direct, project_id: uuid.UUID, code_id: str) -> bool:
    query = "SELECT 1 FROM code_packages WHERE project_id = %(project)s AND id = %(code)s"
    return await direct.one(query, {"project": project_id, "code": code_id}) is not None


async def content(session: AsyncSession, project_id: uuid.UUID, code_id: str) -> bytes | None:
    query = select(CodePackage.content).where(CodePackage.project_id == project_id, CodePackage.id == code_id)
    return (await session.execute(query)).scalar_one_or_none()
