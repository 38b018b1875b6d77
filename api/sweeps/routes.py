"""HTTP for sweeps: parse, call the service, shape the answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status

from api.auth.deps import ProjectPrincipal
from api.db.session import Session
from api.deps import AppSettings
from api.errors import UnsupportedMediaType, error_responses
from api.sweeps import service
from trainmaster.models import Sweep, SweepList, SweepSpec, SweepStatus

PAGE_MAX = 100  # a sweep in a list carries its trial counts, read from every trial

router = APIRouter(
    prefix="/v1/sweeps", tags=["sweeps"], responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503)
)


def require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(f"send the sweep as application/json, not {content_type or 'no type'!r}")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Sweep, dependencies=[Depends(require_json)])
async def create_sweep(request: SweepSpec, session: Session, principal: ProjectPrincipal, response: Response) -> Sweep:
    """Create a sweep; its first trials (up to max_concurrent) are queued with it."""
    sweep = await service.create(session, principal, request)
    response.headers["Location"] = f"/v1/sweeps/{sweep.id}"
    return await service.describe(session, principal, sweep)


@router.get("", response_model=SweepList)
async def list_sweeps(
    session: Session,
    principal: ProjectPrincipal,
    settings: AppSettings,
    status_filter: Annotated[list[SweepStatus], Query(alias="status")] = [],  # noqa: B006
    limit: Annotated[int | None, Query(ge=1)] = None,
) -> SweepList:
    """Sweeps newest first, with trial counts and the best trial (without the full trial list)."""
    page_size = min(limit or settings.page_limit_default, settings.page_limit_max, PAGE_MAX)
    return SweepList(items=await service.list_sweeps(session, principal, statuses=status_filter, limit=page_size))


@router.get("/{sweep_id}", response_model=Sweep)
async def get_sweep(sweep_id: str, session: Session, principal: ProjectPrincipal) -> Sweep:
    """One sweep with its trials ranked by the metric, best first."""
    sweep = await service.get_owned(session, principal, sweep_id)
    return await service.describe(session, principal, sweep)


@router.post("/{sweep_id}/cancel", response_model=Sweep, status_code=status.HTTP_202_ACCEPTED)
async def cancel_sweep(sweep_id: str, session: Session, principal: ProjectPrincipal) -> Sweep:
    """Cancel the sweep's trials that have not ended, and the sweep."""
    sweep = await service.cancel(session, principal, sweep_id)
    return await service.describe(session, principal, sweep)
