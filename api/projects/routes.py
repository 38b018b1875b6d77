"""HTTP for projects: an admin creates and changes them; a project token reads its own."""

from __future__ import annotations

from fastapi import APIRouter, status

from api.auth.deps import AdminPrincipal, ProjectPrincipal
from api.db.session import Session
from api.errors import error_responses
from api.projects import service
from trainmaster.models import Project, ProjectList, ProjectPatch, ProjectSpec

router = APIRouter(prefix="/v1/projects", tags=["projects"], responses=error_responses(401, 403, 404, 409, 422, 503))


@router.post("", response_model=Project, status_code=status.HTTP_201_CREATED)
async def create_project(spec: ProjectSpec, session: Session, _: AdminPrincipal) -> Project:
    """A project on a cluster (`default` unless named), its jobs' priority at most `max_priority`."""
    return await service.create(session, spec)


@router.get("", response_model=ProjectList)
async def list_projects(session: Session, principal: ProjectPrincipal) -> ProjectList:
    """Every project for an admin token; the caller's own for a project token."""
    return ProjectList(items=await service.list_visible(session, principal))


@router.get("/{name}", response_model=Project)
async def get_project(name: str, session: Session, principal: ProjectPrincipal) -> Project:
    return await service.read(session, principal, name)


@router.patch("/{name}", response_model=Project)
async def change_project(name: str, patch: ProjectPatch, session: Session, _: AdminPrincipal) -> Project:
    """Move a project to another cluster or change its max_priority (queued jobs keep their priority)."""
    return await service.change(session, name, patch)
