"""HTTP for jobs: parse, call the service, shape the answer."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status

from api.auth.deps import AnyPrincipal, ProjectPrincipal
from api.db.session import Session
from api.deps import AppSettings
from api.errors import UnsupportedMediaType, error_responses
from api.jobs import service
from api.limits.service import Limits
from api.wire import json_response
from trainmaster.models import EventList, Job, JobControl, JobEvent, JobEventIn, JobList, JobSpec, JobStatus

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
)


async def require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(f"send the job spec as application/json, not {content_type or 'no type'!r}")


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Job, dependencies=[Depends(require_json)])
async def submit_job(
    spec: JobSpec,
    request: Request,
    principal: ProjectPrincipal,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> Response:
    job, created = await service.submit(request.app.state.direct, principal, spec, idempotency_key)
    headers = {"Location": f"/v1/jobs/{job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return json_response(job.wire, status.HTTP_201_CREATED, headers)


@router.get("", response_model=JobList)
async def list_jobs(
    session: Session,
    principal: ProjectPrincipal,
    settings: AppSettings,
    status_filter: Annotated[list[JobStatus], Query(alias="status")] = [],  # noqa: B006
    label: Annotated[list[str], Query(description="key:value, repeatable (all must match)")] = [],  # noqa: B006
    limit: Annotated[int | None, Query(ge=1)] = None,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    id_prefix: Annotated[
        str | None, Query(description="only jobs whose id starts with this (hex digits and dashes, as `ls` shows them)")
    ] = None,
) -> JobList:
    page_size = min(limit or settings.page_limit_default, settings.page_limit_max)
    items, next_cursor = await service.list_page(
        session,
        principal,
        statuses=status_filter,
        labels=label,
        limit=page_size,
        cursor=cursor,
        id_prefix=id_prefix,
        max_bytes=settings.page_max_bytes,
    )
    return JobList(items=items, next_cursor=next_cursor)


@router.get("/{job_id}", response_model=Job)
async def get_job(job_id: str, request: Request, principal: ProjectPrincipal) -> Response:
    state = request.app.state
    arrived = asyncio.get_running_loop().time()
    return json_response(await service.read(state.direct, principal, job_id, state.ranks, arrived))


@router.post("/{job_id}/cancel", response_model=Job, status_code=status.HTTP_202_ACCEPTED)
async def cancel_job(job_id: str, session: Session, principal: ProjectPrincipal) -> Job:
    job = await service.cancel(session, principal, job_id)
    return await service.describe(session, principal, job)


@router.get("/{job_id}/events", response_model=EventList)
async def job_events(
    job_id: str,
    session: Session,
    principal: ProjectPrincipal,
    settings: AppSettings,
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> EventList:
    """The job's events, oldest first: a page holds at most TRAINMASTER_PAGE_MAX_BYTES of messages and
    data; `next_after_id` says where the next one starts."""
    return await service.events(
        session, principal, job_id, after_id=after_id, limit=limit, max_bytes=settings.page_max_bytes
    )


@router.post(
    "/{job_id}/events",
    response_model=JobEvent,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(require_json)],
)
async def add_job_event(
    job_id: str, event: JobEventIn, session: Session, principal: AnyPrincipal, limits: Limits
) -> JobEvent:
    """Record a notable event from inside the job (job token or project token); 429 past the job's or its
    project's event limits (the detail names the limit and its setting)."""
    return await service.add_event(session, principal, job_id, event, limits)


@router.get("/{job_id}/control", response_model=JobControl)
async def job_control(job_id: str, session: Session, principal: AnyPrincipal) -> JobControl:
    """What the platform asks of the running job (job token or project token): `checkpoint` turns true
    when the job is preempted, so `trainmaster.should_checkpoint()` can save its work in time."""
    return await service.control(session, principal, job_id)
