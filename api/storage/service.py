"""Storage per project: the bytes of its live checkpoints and code packages, against its quota
(`projects.storage_quota_bytes`). Above it, a new checkpoint is refused (recorded as deleted, with an
event on its job, and answered 507 so the job's controller removes its files) and an upload is refused
(507, nothing stored); nothing else of the project stops."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth.principal import Principal
from api.errors import DomainError
from api.storage import repository
from trainmaster.models import ProjectStorage
from trainmaster.packing import human_bytes


class StorageQuotaExceeded(DomainError):
    status_code = 507


async def refusal(session: AsyncSession, project_id: uuid.UUID, adding: int, what: str) -> str | None:
    """Why storing `adding` more bytes (`what`: "this checkpoint", "this upload") would take the
    project over its storage quota, or None when it may. Locks the project's figures (see `lock`)."""
    stored = await repository.lock(session, project_id)
    quota = stored.quota_bytes
    if quota is None or stored.used_bytes + adding <= quota:
        return None
    return (
        f"project {stored.project!r} is over its storage quota: {human_bytes(stored.used_bytes)} stored of "
        f"{human_bytes(quota)}, {what} {human_bytes(adding)}. Free some (unpinned checkpoints go by a job's "
        f"checkpoint.num_to_keep and the project's checkpoint retention) or ask an admin to raise it: "
        f"trainmaster project set {stored.project} --storage-quota SIZE; trainmaster storage shows the use"
    )


async def list_visible(session: AsyncSession, principal: Principal) -> list[ProjectStorage]:
    """Every project's for an admin, a project token its own."""
    rows = await repository.list_stored(session, None if principal.is_admin else principal.project_id)
    return [ProjectStorage.model_validate(row, from_attributes=True) for row in rows]
