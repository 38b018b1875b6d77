from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response, status

from api.auth.deps import AnyPrincipal, ProjectPrincipal
from api.checkpoints import service
from api.db.session import Session
from api.deps import AppSettings
from api.errors import domain_error_response, error_responses
from api.jobs.routes import require_json
from api.limits.service import Limits
from api.storage.service import StorageQuotaExceeded
from trainmaster.models import CheckpointIn, CheckpointInfo, CheckpointList

router = APIRouter(
    prefix="/v1/jobs/{job_id}/checkpoints",
    tags=["checkpoints"],
    responses=error_responses(400, 401, 403, 404, 413, 415, 422, 429, 503, 507),
)


@router.get("", response_model=CheckpointList)
async def list_checkpoints(
    job_id: str,
    session: Session,
    principal: ProjectPrincipal,
    settings: AppSettings,
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> CheckpointList:
    """Checkpoints the job reported, oldest first: path, step and the metrics reported with each. A
    page holds at most TRAINMASTER_PAGE_MAX_BYTES of them; `next_after_id` says where the next starts."""
    return await service.list_for_job(
        session, principal, job_id, after_id=after_id, limit=limit, max_bytes=settings.page_max_bytes
    )


@router.post("", status_code=status.HTTP_204_NO_CONTENT, dependencies=[Depends(require_json)])
async def record_checkpoint(
    job_id: str,
    checkpoint: CheckpointIn,
    session: Session,
    principal: AnyPrincipal,
    limits: Limits,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    """Recorded by the job itself (job token) when Ray Train reports a checkpoint. A job token's own
    attempt is the checkpoint's (what `?attempt=` says is kept only for other tokens). 507 when it
    would take the project over its storage quota: it is listed as deleted, with why, and the job
    removes its files. 429 past the job's checkpoint rows (TRAINMASTER_CHECKPOINTS_PER_JOB): nothing recorded."""
    refused = await service.record(session, principal, job_id, checkpoint, principal.attempt or attempt, limits)
    if refused is not None:  # committed all the same: the row says it is gone, the job's event says why
        return domain_error_response(StorageQuotaExceeded(refused))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{checkpoint_id}/pin", response_model=CheckpointInfo)
async def pin_checkpoint(
    job_id: str, checkpoint_id: Annotated[int, Path(ge=1)], session: Session, principal: ProjectPrincipal
) -> CheckpointInfo:
    """Keep this checkpoint whatever the job's `checkpoint` policy and its project's retention say
    (409 once it was deleted)."""
    return await service.pin(session, principal, job_id, checkpoint_id, pinned=True)


@router.delete("/{checkpoint_id}/pin", response_model=CheckpointInfo)
async def unpin_checkpoint(
    job_id: str, checkpoint_id: Annotated[int, Path(ge=1)], session: Session, principal: ProjectPrincipal
) -> CheckpointInfo:
    """Let the policy and the retention decide again (the collector's next pass)."""
    return await service.pin(session, principal, job_id, checkpoint_id, pinned=False)
