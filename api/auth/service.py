"""Bearer tokens: random, shown once, stored as SHA-256 (they carry 256 bits, so no slow hash is needed)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import repository
from api.auth.principal import Principal, Scope
from api.errors import Conflict, Forbidden, NotFound, Unauthorized, ValidationError
from api.projects import repository as projects
from trainmaster.models import AttemptStatus

if TYPE_CHECKING:
    from api.auth.cache import TokenCache
    from api.db.direct import Direct
    from api.db.models import ApiToken

log = logging.getLogger("trainmaster.auth")

TOKEN_PREFIX = "tm_"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PROJECT_TOKEN_LIFE = timedelta(days=90)  # a project token's default life; admin and metrics: none
_touches: set[asyncio.Task[None]] = set()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def expiry(scope: Scope, expires_in: timedelta | None, *, never: bool = False) -> datetime | None:
    """When a new token of `scope` expires: `expires_in` from now; else 90 days for project tokens."""
    if never:
        return None
    if expires_in is None:
        expires_in = PROJECT_TOKEN_LIFE if scope is Scope.project else None
    return None if expires_in is None else datetime.now(UTC) + expires_in


async def create_token(
    session: AsyncSession,
    project_name: str,
    *,
    scope: Scope = Scope.project,
    description: str | None = None,
    expires_at: datetime | None = None,
    user_name: str | None = None,
    parent_id: uuid.UUID | None = None,
) -> tuple[str, ApiToken]:
    """A new token of `project_name` (created on the cluster `default` if new): (the secret, its row).
    `parent_id`: the token that minted it, which it is revoked with (migration 0027)."""
    if scope is Scope.job:
        raise ValidationError.field(["body", "scope"], "job tokens are the platform's own: one per attempt")
    project = await repository.get_or_create_project(session, project_name)
    token = new_token()
    row = await repository.add_token(
        session,
        project_id=project.id,
        token_hash=hash_token(token),
        description=description,
        scope=scope.value,
        expires_at=expires_at,
        user_name=user_name,
        parent_id=parent_id,
    )
    return token, row


async def create_project_token(session: AsyncSession, project_name: str, description: str | None = None) -> str:
    token, _ = await create_token(
        session, project_name, description=description, expires_at=expiry(Scope.project, None)
    )
    return token


async def create_job_token(
    session: AsyncSession, project_id: uuid.UUID, job_id: uuid.UUID, attempt: int | None = None
) -> str:
    """A job token row for `attempt`, and its claim: what the launch carries (see `claim_job_token`)."""
    claim = new_token()
    await repository.add_token(
        session,
        project_id=project_id,
        job_id=job_id,
        token_hash=hash_token(claim),
        description="job",
        scope="job",
        attempt=attempt,
    )
    return claim


async def claim_job_token(session: AsyncSession, job_id: str, claim: str, ttl_s: float) -> str:
    """The job token for `claim`, once. The claim travels in the launch, which every job on the Ray
    cluster can read through the Jobs API: so it works once, for its own job, within `ttl_s` of the
    launch's making. Presented again it is refused and changes nothing: the job keeps its token (a
    replay revoking it would let any job that read the launch stop that job). A warning is logged."""
    job = NotFound.unless_uuid(job_id, "job")
    token = new_token()
    outcome = await repository.claim_job_token(session, job, hash_token(claim), hash_token(token), ttl_s)
    if outcome == "claimed":
        return token
    if outcome == "replayed":
        log.warning("job_token_claim_replayed", extra={"job_id": str(job)})
        raise Unauthorized("this claim was used already")
    raise Unauthorized("unknown, expired or used job token claim")


async def authenticate(direct: Direct, authorization: str | None, cache: TokenCache | None = None) -> Principal:
    """Who sent `Authorization: Bearer <token>`; with a cache, a token checked moments ago and not
    revoked since is not looked up again (api/auth/cache.py). An expired token is refused, cached or
    not; its last_used_at is written at most once a minute per process, after the answer."""
    if not authorization:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    token_hash = hash_token(token.strip())
    principal = await cache.get(token_hash) if cache is not None else None
    if principal is None:
        stamp = cache.stamp() if cache is not None else None
        found = await repository.find_active_token(direct, token_hash)
        if found is None:
            await _refuse_fenced(direct, token_hash)
            raise Unauthorized("unknown, expired or revoked token: create one with `trainmaster token create`")
        token_id, job_id, project_id, project_name, scope, expires_at, cluster_name, max_priority, attempt, user = found
        principal = Principal(
            project_id=project_id,
            project_name=project_name,
            job_id=job_id,
            token_id=token_id,
            scope=Scope.job if job_id is not None else Scope(scope),
            cluster_name=cluster_name,
            max_priority=max_priority,
            expires_at=expires_at,
            attempt=attempt,
            user_name=user,
        )
        if cache is not None and stamp is not None:
            cache.put(token_hash, principal, stamp)
    if principal.expires_at is not None and time.time() >= principal.expires_at:
        raise Unauthorized("the token expired: create a new one with `trainmaster token create`")
    if cache is not None and principal.token_id is not None and cache.due_touch(principal.token_id):
        _touch_later(direct, principal.token_id)
    return principal


class AttemptSuperseded(Conflict):
    """A job token of an attempt that was superseded or has ended: a ghost of an old attempt."""


ENDED_ATTEMPT = [status.value for status in AttemptStatus if status.terminal]


async def _refuse_fenced(direct: Direct, token_hash: str) -> None:
    """Fencing: a job token whose attempt is no longer its job's latest, or has ended, is refused with
    409 (not 401: the caller is a ghost of an attempt, not a stranger), and the write is counted in the
    job's `fenced` event for that attempt, so it never moves status, adds points or registers a
    checkpoint, and is seen."""
    found = await repository.find_fenced(direct, token_hash, ENDED_ATTEMPT)
    if found is None:
        return
    job_id, attempt, latest, latest_status = found
    why = f"superseded by attempt {latest}" if latest > attempt else f"ended ({latest_status})"
    message = f"writes from attempt {attempt} refused: that attempt was {why}"
    count = await repository.count_fenced(direct, job_id, attempt, message)
    log.warning("fenced_write", extra={"job_id": str(job_id), "attempt": attempt, "count": count})
    raise AttemptSuperseded(
        f"attempt {attempt} of job {job_id} was {why}: its processes may no longer write (refused {count} time(s))"
    )


def _touch_later(direct: Direct, token_id: uuid.UUID) -> None:
    async def touch() -> None:
        try:
            await repository.touch_token(direct, token_id)
        except Exception as exc:  # a lost last_used_at never fails a request
            log.warning("token_touch_failed", extra={"token_id": str(token_id), "error": str(exc)})

    task = asyncio.get_running_loop().create_task(touch())
    _touches.add(task)
    task.add_done_callback(_touches.discard)


# -- the admin routes' decisions ------------------------------------------------------------------


def may_manage(principal: Principal, scope: str, project_id: uuid.UUID, job_id: uuid.UUID | None) -> bool:
    """Whether `principal` may see or revoke a token: an admin any; a project token its own project's
    project and metrics tokens (never an admin's or a job's)."""
    if principal.is_admin:
        return True
    return project_id == principal.project_id and job_id is None and scope in (Scope.project, Scope.metrics)


async def list_tokens(session: AsyncSession, principal: Principal) -> list[tuple[ApiToken, str]]:
    if principal.is_admin:
        rows = await repository.list_tokens(session, project_id=None, scopes=None)
    else:
        rows = await repository.list_tokens(
            session, project_id=principal.project_id, scopes=[Scope.project.value, Scope.metrics.value]
        )
    return rows


async def revoke_token(session: AsyncSession, principal: Principal, raw_id: str) -> tuple[ApiToken, str]:
    """Revoke a token the caller may manage (404 for any other: never revealing that it exists)."""
    token_id = NotFound.unless_uuid(raw_id, "token")
    found = await repository.get_token(session, token_id)
    if found is None or not may_manage(principal, found[0].scope, found[0].project_id, found[0].job_id):
        raise NotFound(f"no token {raw_id!r}")
    await repository.revoke(session, token_id)
    return found[0], found[1]


async def issue(
    session: AsyncSession,
    principal: Principal,
    *,
    project: str | None,
    scope: Scope,
    description: str | None,
    expires_in: timedelta | None,
    never: bool = False,
    user_name: str | None,
    max_life: timedelta,
) -> tuple[str, ApiToken, str]:
    """A new token for POST /v1/tokens: an admin's for any project and scope; a project token's for its
    own project, scope project. A metrics token reads every project's figures on /metrics, so only an
    admin mints one (a project token reads its own project's there itself). What a token mints never
    outlives it (`minted_expiry`) and is revoked with it (migration 0027)."""
    name = project or principal.project_name
    if not principal.is_admin:
        if scope is Scope.admin:
            raise Forbidden("only an admin token can create admin tokens")
        if scope is Scope.metrics:
            raise Forbidden(
                "only an admin token can create metrics tokens: one reads every project's figures on /metrics; "
                "a project token reads its own project's there itself"
            )
        if name != principal.project_name:
            raise Forbidden(f"a project token creates tokens of its own project ({principal.project_name!r}) only")
    elif project is not None and await projects.find(session, name) is None:
        raise ValidationError.field(["body", "project"], f"no project {name!r}: create it with POST /v1/projects")
    token, row = await create_token(
        session,
        name,
        scope=scope,
        description=description,
        expires_at=minted_expiry(expiry(scope, expires_in, never=never), principal.expires_at, max_life),
        user_name=user_name,
        parent_id=principal.token_id,
    )
    return token, row, name


def minted_expiry(wanted: datetime | None, parent_expires_at: float | None, max_life: timedelta) -> datetime:
    """When a token minted by a token expires: when asked (None: never), but no later than the token
    that minted it (`parent_expires_at`, epoch seconds), or `max_life` from now when that one never
    expires; so no chain of minting outlives the token it started from."""
    if parent_expires_at is not None:  # floored to the microsecond: never a float's rounding past the parent
        latest = EPOCH + timedelta(microseconds=math.floor(parent_expires_at * 1_000_000))
    else:
        latest = datetime.now(UTC) + max_life
    return latest if wanted is None or wanted > latest else wanted
