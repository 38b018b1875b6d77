"""HTTP for tokens: an admin lists and revokes any; a project token its own project's."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Depends, Response, status

from api.auth import service
from api.auth.deps import ProjectPrincipal
from api.auth.principal import Scope
from api.db.models import ApiToken
from api.db.session import Session
from api.deps import AppSettings
from api.errors import error_responses
from api.limits.service import within_token_limit
from trainmaster.models import JobTokenClaim, JobTokenClaimed, TokenCreated, TokenInfo, TokenList, TokenSpec

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=error_responses(401, 403, 404, 422, 503))


@router.get("", response_model=TokenList)
async def list_tokens(session: Session, principal: ProjectPrincipal) -> TokenList:
    """Tokens not revoked, newest first: all for an admin token (job tokens included); for a project
    token its own project's project and metrics tokens."""
    return TokenList(items=[to_wire(row, project) for row, project in await service.list_tokens(session, principal)])


@router.post(
    "",
    response_model=TokenCreated,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(within_token_limit)],  # 429 past TRAINMASTER_TOKENS_PER_PROJECT for a project token
    responses=error_responses(429),
)
async def create_token(
    spec: TokenSpec, session: Session, principal: ProjectPrincipal, settings: AppSettings
) -> TokenCreated:
    """A new token; its secret is in this answer only (stored hashed). It expires no later than the token
    that made it (or TRAINMASTER_MINTED_TOKEN_MAX_LIFE_S from now when that one never does), and is
    revoked with it."""
    token, row, project = await service.issue(
        session,
        principal,
        project=spec.project,
        scope=Scope(spec.scope),
        description=spec.description,
        expires_in=None if spec.expires_in_s is None else timedelta(seconds=spec.expires_in_s),
        never=not spec.expires,
        user_name=spec.user,
        max_life=timedelta(seconds=settings.minted_token_max_life_s),
    )
    return TokenCreated(**to_wire(row, project).model_dump(), token=token)


@router.post("/claim", response_model=JobTokenClaimed, status_code=status.HTTP_201_CREATED)
async def claim_job_token(body: JobTokenClaim, session: Session, settings: AppSettings) -> JobTokenClaimed:
    """A job's driver exchanges its launch's single-use claim for its job token (no bearer token: the
    claim is the credential). A claim works once, within the launch and starting timeouts; presented
    again, 401, and nothing changes (the token it gave keeps working)."""
    ttl_s = settings.launch_timeout_s + settings.starting_timeout_s
    return JobTokenClaimed(token=await service.claim_job_token(session, body.job_id, body.claim, ttl_s))


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_token(token_id: str, session: Session, principal: ProjectPrincipal) -> Response:
    """Revoke a token: every API process stops accepting it at once, its open streams end within seconds."""
    await service.revoke_token(session, principal, token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def to_wire(row: ApiToken, project: str) -> TokenInfo:
    return TokenInfo(
        id=str(row.id),
        project=project,
        scope="job" if row.job_id is not None else row.scope,
        description=row.description,
        user=row.user_name,
        job_id=None if row.job_id is None else str(row.job_id),
        created_at=row.created_at,
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
    )
