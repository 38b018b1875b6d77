"""HTTP for storage: `GET /v1/storage`, what each project stores against its quota."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth.deps import ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.storage import service
from trainmaster.models import StorageList

router = APIRouter(prefix="/v1/storage", tags=["storage"], responses=error_responses(401, 403, 503))


@router.get("", response_model=StorageList)
async def read_storage(session: Session, principal: ProjectPrincipal) -> StorageList:
    """Bytes of live checkpoints (as the platform measured them; a checkpoint not yet measured as its job
    reported it) and code packages per project, with its storage quota: every project for an admin
    token, its own for a project token."""
    return StorageList(items=await service.list_visible(session, principal))
