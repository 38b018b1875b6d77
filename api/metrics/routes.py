from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status

from api.auth.deps import AnyPrincipal, ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.jobs import service as jobs
from api.jobs.routes import require_json
from api.limits.service import Limits
from api.metrics import service
from api.streaming.follow import job_stream, last_event_id
from api.streaming.sse import EventStream
from trainmaster.models import MetricBatchAck, MetricBatchIn, MetricList


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its $defs written in place (it sits inside the OpenAPI document)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            return {key: walk(value) for key, value in node.items()}
        return [walk(item) for item in node] if isinstance(node, list) else node

    return dict(walk(schema))


BATCH_SCHEMA = _inlined(MetricBatchIn.model_json_schema())

router = APIRouter(
    prefix="/v1/jobs/{job_id}/metrics",
    tags=["metrics"],
    responses=error_responses(400, 401, 403, 404, 413, 415, 422, 429, 503),
)


@router.post(
    "",
    response_model=MetricBatchAck,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(require_json)],
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": BATCH_SCHEMA}}}},
)
async def ingest_metrics(job_id: str, request: Request, principal: AnyPrincipal, limits: Limits) -> MetricBatchAck:
    """Store a batch of points (job token or project token); retries with the same batch_id store nothing twice.

    A batch with bad points is refused whole (422, nothing stored), its detail naming every bad point as
    `loc: ["body", "points", <index>, <field>, …]`, so a sender can drop those and send the rest again.
    The body (MetricBatchIn) is validated straight from its bytes into plain values, not models.
    Past a write limit of the job or its project (values a second, distinct names) the batch is refused
    whole: 429 naming the limit and its setting (with Retry-After for a rate), 413 for one batch that no
    wait would let through."""
    return await service.ingest(request.app.state.direct, limits, principal, job_id, await request.body())


@router.get("", response_model=MetricList)
async def read_metrics(
    job_id: str,
    session: Session,
    principal: ProjectPrincipal,
    name: Annotated[list[str], Query(description="metric names, repeatable")] = [],  # noqa: B006
    since_step: Annotated[int | None, Query(ge=0)] = None,
    until_step: Annotated[int | None, Query(ge=0, description="last step (inclusive), for a zoomed chart")] = None,
    rank: Annotated[int | None, Query(ge=0, description="one worker's points only")] = None,
    max_points: Annotated[
        int | None, Query(ge=2, le=100_000, description="downsample, keeping minima and maxima")
    ] = None,
    after_seq: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> Response:
    """A MetricList, encoded once from plain values (`response_model` stays for the OpenAPI schema:
    FastAPI neither validates nor encodes again a Response)."""
    items = await service.read(
        session,
        principal,
        job_id,
        names=name,
        since_step=since_step,
        until_step=until_step,
        rank=rank,
        max_points=max_points,
        after_seq=after_seq,
        limit=limit,
    )
    return Response(service.encode_list(items), media_type="application/json")


@router.get(
    "/stream", status_code=200, response_class=EventStream, responses={200: {"content": {"text/event-stream": {}}}}
)
async def stream_metrics(
    job_id: str,
    request: Request,
    session: Session,
    principal: ProjectPrincipal,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after_seq: Annotated[int | None, Query(ge=0, description="like Last-Event-ID")] = None,
) -> EventStream:
    """SSE: `metrics` events (id = sequence), `status` on transitions, `end` when the job is over."""
    job = await jobs.get_owned(session, principal, job_id)
    resume_after = last_event_id(last_event_id_header, after_seq)
    return job_stream(request, principal, job.id, service.read_for_stream, "metrics", resume_after)
