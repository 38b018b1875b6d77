from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from api.auth.deps import ProjectPrincipal
from api.code_packages import repository, service
from api.code_packages.gate import UploadGate
from api.db.direct import OnSession
from api.db.session import Session
from api.deps import AppSettings
from api.errors import NotFound, UnsupportedMediaType, error_responses
from trainmaster.models import CodeUpload

router = APIRouter(prefix="/v1/code", tags=["code"], responses=error_responses(400, 401, 403, 413, 415, 422, 503, 507))

ZIP_TYPES = {"application/zip", "application/x-zip-compressed", "application/octet-stream"}


@router.post(
    "",
    response_model=CodeUpload,
    status_code=status.HTTP_201_CREATED,
    openapi_extra={
        "requestBody": {
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
            "required": True,
        }
    },
)
async def upload_code(
    request: Request, session: Session, principal: ProjectPrincipal, settings: AppSettings
) -> CodeUpload:
    """Upload a working directory as a zip; the answer's `id` goes into JobSpec.code."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ZIP_TYPES:
        raise UnsupportedMediaType(f"send the working directory as application/zip, not {content_type or 'no type'!r}")
    gate: UploadGate = request.app.state.upload_gate
    async with gate.slot(principal.project_id):
        content = await request.body()
        return await service.upload(session, principal, content, settings)


@router.head("/{code_id}", status_code=status.HTTP_200_OK, response_class=Response, responses=error_responses(404))
async def code_exists(code_id: str, session: Session, principal: ProjectPrincipal) -> Response:
    """200 when this project holds the package `sha256:<hex>` already, 404 when not: a client that
    hashed its zip skips uploading it again (`trainmaster run`)."""
    if not await repository.exists(OnSession(session), principal.project_id, code_id):
        raise NotFound(f"no uploaded code {code_id}")
    return Response(status_code=status.HTTP_200_OK)
