from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request

from api.auth.deps import ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.jobs import service as jobs
from api.logs import service
from api.streaming.follow import job_stream, last_event_id
from api.streaming.sse import EventStream
from trainmaster.models import LogList

router = APIRouter(
    prefix="/v1/jobs/{job_id}/logs", tags=["logs"], responses=error_responses(400, 401, 403, 404, 413, 422, 429, 503)
)


@router.get("", response_model=LogList)
async def read_logs(
    job_id: str,
    request: Request,
    session: Session,
    principal: ProjectPrincipal,
    after_seq: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="only the last this many lines")] = None,
) -> LogList:
    """Stored output of the job's driver and workers, oldest first; readable after the cluster is gone.
    A page holds at most TRAINMASTER_PAGE_MAX_BYTES of text (its first line always); `next_after_seq`
    says where the next one starts."""
    max_bytes = request.app.state.settings.page_max_bytes
    return await service.read(session, principal, job_id, after_seq, limit, tail=tail, max_bytes=max_bytes)


@router.get(
    "/stream", status_code=200, response_class=EventStream, responses={200: {"content": {"text/event-stream": {}}}}
)
async def stream_logs(
    job_id: str,
    request: Request,
    session: Session,
    principal: ProjectPrincipal,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after_seq: Annotated[int | None, Query(ge=0)] = None,
) -> EventStream:
    """SSE: `logs` events (id = sequence), `status` on transitions, `end` when the job is over."""
    job = await jobs.get_owned(session, principal, job_id)
    resume_after = last_event_id(last_event_id_header, after_seq)
    return job_stream(request, principal, job.id, service.read_for_stream, "logs", resume_after)
