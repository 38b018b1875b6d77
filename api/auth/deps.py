"""Who is calling, as FastAPI dependencies: any token, a project's (admin included), an admin's."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from api.auth.principal import Principal, Scope
from api.auth.service import authenticate
from api.errors import Forbidden, Unauthorized


def not_metrics(principal: Principal) -> Principal:
    """Any caller but a metrics token: that one only reads /metrics (api/ops/routes.py)."""
    if principal.scope is Scope.metrics:
        raise Forbidden("a metrics token can only read /metrics")
    return principal


async def current_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    """The caller; a token not in the cache is looked up on a direct connection (no ORM session)."""
    state = request.app.state
    return not_metrics(await authenticate(state.direct, authorization, getattr(state, "tokens", None)))


async def current_project(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """A project token (an admin token is one too, of its own project); job-scoped tokens may only
    write their own job's metrics and logs."""
    if principal.is_job_token:
        raise Unauthorized("a job token can only write its own job's metrics and logs")
    return principal


async def current_admin(principal: Annotated[Principal, Depends(current_project)]) -> Principal:
    """An admin token: it manages clusters, projects and tokens."""
    if not principal.is_admin:
        raise Forbidden(f"this needs an admin token; this one is a {principal.scope.value} token")
    return principal


AnyPrincipal = Annotated[Principal, Depends(current_principal)]
ProjectPrincipal = Annotated[Principal, Depends(current_project)]
AdminPrincipal = Annotated[Principal, Depends(current_admin)]
