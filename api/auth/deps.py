"""Who is calling, as FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from api.auth.principal import Principal
from api.auth.service import authenticate
from api.errors import Unauthorized


async def current_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    """The caller; a token not in the cache is looked up on a direct connection (no ORM session)."""
    return await authenticate(request.app.state.direct, authorization, getattr(request.app.state, "tokens", None))


async def current_project(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """A project token; job-scoped tokens may only write their own job's metrics and logs."""
    if principal.is_job_token:
        raise Unauthorized("a job token can only write its own job's metrics and logs")
    return principal


AnyPrincipal = Annotated[Principal, Depends(current_principal)]
ProjectPrincipal = Annotated[Principal, Depends(current_project)]
