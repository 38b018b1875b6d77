from __future__ import annotations

from fastapi import APIRouter, Request, status

from api.auth.deps import ProjectPrincipal
from api.code_packages import service
from api.db.session import Session
from api.deps import AppSettings
from api.errors import UnsupportedMediaType, error_responses
from trainmaster.models import CodeUpload

router = APIRouter(prefix="/v1/code", tags=["code"], responses=error_responses(400, 401, 413, 415, 422, 503))

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
    content = await request.body()
    return await service.upload(session, principal, content, settings)
