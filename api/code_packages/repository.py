from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Runner
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


# Whether the project stores the package, for a job or sweep about to name it; one not named for an
# hour has its retention clock (created_at) restarted by the same statement. Retention deletes only
# packages older than code_retention_days, and skips rows locked by this update: so a package is never
# deleted between this check and the insert of the job that names it (it is refused here instead).
_NAMED = """
    WITH touched AS (
        UPDATE code_packages SET created_at = now()
        WHERE project_id = %(project)s AND id = %(code)s AND created_at < now() - interval '1 hour'
        RETURNING 1
    )
    SELECT 1 FROM touched UNION ALL SELECT 1 FROM code_packages WHERE project_id = %(project)s AND id = %(code)s
    LIMIT 1
"""


async def exists(runner: Runner, project_id: uuid.UUID, code_id: str) -> bool:
    """Whether the project stores this package (and it is now safe from retention: `_NAMED`)."""
    return await runner.one(_NAMED, {"project": project_id, "code": code_id}) is not None


async def content(session: AsyncSession, project_id: uuid.UUID, code_id: str) -> bytes | None:
    query = select(CodePackage.content).where(CodePackage.project_id == project_id, CodePackage.id == code_id)
    return (await session.execute(query)).scalar_one_or_none()
