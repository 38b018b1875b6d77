"""Uploaded working directories: checked, content-addressed, stored in PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.code_packages import archive, repository
from api.db.direct import OnSession
from api.errors import PayloadTooLarge, ValidationError
from api.settings import Settings
from api.storage import service as storage
from api.storage.service import StorageQuotaExceeded
from trainmaster.models import CodeUpload


async def upload(session: AsyncSession, principal: Principal, content: bytes, settings: Settings) -> CodeUpload:
    # Reading every member and hashing take about a second per 100 MB: off the event loop.
    code_id, info = await asyncio.to_thread(_checked, content, settings)
    # A package the project stores already adds nothing (content-addressed).
    adding = 0 if await repository.exists(OnSession(session), principal.project_id, code_id) else len(content)
    if (refused := await storage.refusal(session, principal.project_id, adding, "this upload")) is not None:
        raise StorageQuotaExceeded(refused)
    await repository.store(session, principal.project_id, code_id, content, info.file_count)
    return CodeUpload(id=code_id, size=len(content), file_count=info.file_count)


def _checked(content: bytes, settings: Settings) -> tuple[str, archive.ArchiveInfo]:
    try:
        info = archive.inspect(
            content, max_files=settings.max_code_files, max_unpacked_bytes=settings.max_code_unpacked_bytes
        )
    except archive.Refused as exc:
        if exc.too_large:
            raise PayloadTooLarge(str(exc)) from None
        raise ValidationError.field(["body"], str(exc)) from None
    return "sha256:" + hashlib.sha256(content).hexdigest(), info
