"""Uploaded working directories: checked, content-addressed, stored in PostgreSQL."""

from __future__ import annotations

import hashlib

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.code_packages import archive, repository
from api.settings import Settings
from trainmaster.models import CodeUpload


async def upload(session: AsyncSession, principal: Principal, content: bytes, settings: Settings) -> CodeUpload:
    info = archive.inspect(
        content, max_files=settings.max_code_files, max_unpacked_bytes=settings.max_code_unpacked_bytes
    )
    code_id = "sha256:" + hashlib.sha256(content).hexdigest()
    await repository.store(session, principal.project_id, code_id, content, info.file_count)
    return CodeUpload(id=code_id, size=len(content), file_count=info.file_count)
