from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.direct import Direct
from api.db.models import ApiToken, ClusterRow, Project

DEFAULT_CLUSTER = "default"


async def get_or_create_project(session: AsyncSession, name: str) -> Project:
    """The project `name`; a new one lands on the cluster `default` (made by migration 0013)."""
    default_cluster = select(ClusterRow.id).where(ClusterRow.name == DEFAULT_CLUSTER).scalar_subquery()
    await session.execute(
        insert(Project).values(id=uuid.uuid4(), name=name, cluster_id=default_cluster).on_conflict_do_nothing()
    )
    return (await session.execute(select(Project).where(Project.name == name))).scalar_one()


async def add_token(
    session: AsyncSession,
    *,
    project_id: uuid.UUID,
    token_hash: str,
    job_id: uuid.UUID | None = None,
    description: str | None = None,
    scope: str = "project",
    expires_at: datetime | None = None,
    user_name: str | None = None,
    attempt: int | None = None,
    parent_id: uuid.UUID | None = None,
) -> ApiToken:
    row = ApiToken(
        project_id=project_id,
        token_hash=token_hash,
        job_id=job_id,
        description=description,
        scope=scope,
        expires_at=expires_at,
        user_name=user_name,
        attempt=attempt,
        parent_id=parent_id,
    )
    session.add(row)
    await session.flush()
    return row


# Who an active token belongs to, on a direct connection: (token id, job id, project id, project name,
# scope, expiry as epoch seconds, cluster name, max priority, attempt, user). An expired token is not found, nor a job
# token not yet claimed (its hash is its claim's: a claim authenticates nothing), nor a job token whose
# attempt is no longer its job's latest (FIND_FENCED tells why).
FIND_ACTIVE_TOKEN = """
    SELECT t.id, t.job_id, p.id, p.name, t.scope, extract(epoch FROM t.expires_at)::float8, c.name, p.max_priority,
           t.attempt, t.user_name
    FROM api_tokens t JOIN projects p ON p.id = t.project_id JOIN clusters c ON c.id = p.cluster_id
    WHERE t.token_hash = %(hash)s AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
      AND (t.job_id IS NULL OR t.claimed_at IS NOT NULL)
      AND (t.attempt IS NULL OR t.attempt = (SELECT max(a.n) FROM job_attempts a WHERE a.job_id = t.job_id))
"""

# A claimed job token whose attempt was superseded (a later attempt exists) or has ended: (job id, its
# attempt, the job's latest attempt, that attempt's status). A token revoked while its attempt still runs
# (a replayed claim) is not one: it stays a plain 401.
FIND_FENCED = """
    SELECT t.job_id, t.attempt, latest.n, latest.status::text
    FROM api_tokens t
    CROSS JOIN LATERAL (
        SELECT a.n, a.status FROM job_attempts a WHERE a.job_id = t.job_id ORDER BY a.n DESC LIMIT 1
    ) latest
    WHERE t.token_hash = %(hash)s AND t.job_id IS NOT NULL AND t.attempt IS NOT NULL AND t.claimed_at IS NOT NULL
      AND (t.attempt < latest.n
           OR EXISTS (SELECT 1 FROM job_attempts a WHERE a.job_id = t.job_id AND a.n = t.attempt
                      AND a.status::text = ANY(%(ended)s)))
"""

# A refused write of a fenced attempt, counted: the job's `fenced` event of that attempt gets one more
# (count, last_at), or is written the first time.
COUNT_FENCED = """
    WITH bumped AS (
        UPDATE job_events SET count = count + 1, last_at = now()
        WHERE id = (SELECT id FROM job_events WHERE job_id = %(job_id)s AND kind = 'fenced'
                      AND data @> jsonb_build_object('attempt', %(attempt)s::int)
                    ORDER BY id DESC LIMIT 1)
        RETURNING count
    ), inserted AS (
        INSERT INTO job_events (job_id, kind, message, data)
        SELECT %(job_id)s, 'fenced', %(message)s, jsonb_build_object('attempt', %(attempt)s::int)
        WHERE NOT EXISTS (SELECT 1 FROM bumped)
        RETURNING count
    )
    SELECT count FROM bumped UNION ALL SELECT count FROM inserted
"""

# A job token's claim exchanged for the token, once: only an unclaimed, unrevoked row of that job made
# less than `ttl_s` ago matches; its hash becomes the new token's and the claim's is kept.
CLAIM_JOB_TOKEN = text(
    """
    UPDATE api_tokens SET token_hash = :token_hash, claim_hash = token_hash, claimed_at = now()
    WHERE token_hash = :claim_hash AND job_id = :job_id AND claimed_at IS NULL AND revoked_at IS NULL
      AND created_at > now() - make_interval(secs => :ttl_s)
    RETURNING id
    """
)

# A claim presented after its use, read only: a spent claim changes nothing. Whoever can read a launch
# (any job of its Ray cluster) can replay its claim, so a replay revoking the token it gave would let
# one tenant stop another's jobs.
SPENT_CLAIM = text("SELECT 1 FROM api_tokens WHERE claim_hash = :claim_hash AND job_id = :job_id")


async def claim_job_token(
    session: AsyncSession, job_id: uuid.UUID, claim_hash: str, token_hash: str, ttl_s: float
) -> str:
    """'claimed', 'replayed' (a used claim: refused, and nothing changes) or 'refused' (unknown,
    expired, revoked, or another job's)."""
    params = {"job_id": job_id, "claim_hash": claim_hash}
    if (await session.execute(CLAIM_JOB_TOKEN, {**params, "token_hash": token_hash, "ttl_s": ttl_s})).first():
        return "claimed"
    if (await session.execute(SPENT_CLAIM, params)).first():
        return "replayed"
    return "refused"


# At most once a minute per token, whichever API process asks (the WHERE), and never a revocation's
# NOTIFY: the trigger of 0006 fires on other columns only.
TOUCH_TOKEN = """
    UPDATE api_tokens SET last_used_at = now()
    WHERE id = %(id)s AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')
"""


async def find_active_token(direct: Direct, token_hash: str) -> tuple[Any, ...] | None:
    return await direct.one(FIND_ACTIVE_TOKEN, {"hash": token_hash})


async def find_fenced(direct: Direct, token_hash: str, ended: Sequence[str]) -> tuple[Any, ...] | None:
    return await direct.one(FIND_FENCED, {"hash": token_hash, "ended": list(ended)})


async def count_fenced(direct: Direct, job_id: uuid.UUID, attempt: int, message: str) -> int:
    row = await direct.one(COUNT_FENCED, {"job_id": job_id, "attempt": attempt, "message": message})
    return int(row[0]) if row else 0


async def touch_token(direct: Direct, token_id: uuid.UUID) -> None:
    await direct.one(TOUCH_TOKEN + " RETURNING id", {"id": token_id})


def _listed() -> Any:
    return select(ApiToken, Project.name).join(Project, Project.id == ApiToken.project_id)


async def list_tokens(
    session: AsyncSession, *, project_id: uuid.UUID | None, scopes: Sequence[str] | None
) -> list[tuple[ApiToken, str]]:
    """Tokens not revoked, newest first: all, or one project's; only `scopes` when given."""
    query = _listed().where(ApiToken.revoked_at.is_(None)).order_by(ApiToken.created_at.desc(), ApiToken.id)
    if project_id is not None:
        query = query.where(ApiToken.project_id == project_id)
    if scopes is not None:
        query = query.where(ApiToken.scope.in_(scopes), ApiToken.job_id.is_(None))
    return [(row[0], row[1]) for row in await session.execute(query)]


async def get_token(session: AsyncSession, token_id: uuid.UUID) -> tuple[ApiToken, str] | None:
    row = (await session.execute(_listed().where(ApiToken.id == token_id))).first()
    return None if row is None else (row[0], row[1])


async def revoke(session: AsyncSession, token_id: uuid.UUID) -> None:
    await session.execute(
        update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None)).values(revoked_at=func.now())
    )
