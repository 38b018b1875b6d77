"""Who may run what where: the registered Ray clusters, the projects that run on them, and the
API tokens that act for a project, a job or an admin."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Double, ForeignKey, Index, Integer, SmallInteger, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from api.db.models.base import Base, inserted_at


class ClusterRow(Base):
    """A registered Ray cluster (a row of `clusters`), which the platform dispatches to: a trust
    domain (0013). Its Ray token is read from `token_file` or the environment variable `token_env` of
    the dispatcher; never stored here. `trainmaster.models.Cluster` is its wire form."""

    __tablename__ = "clusters"

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    address: Mapped[str] = mapped_column(Text)
    token_file: Mapped[str | None] = mapped_column(Text)
    token_env: Mapped[str | None] = mapped_column(String(256))
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = inserted_at()


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = inserted_at()
    # The one cluster the project's jobs run on (0013); a job's priority is at most max_priority.
    cluster_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("clusters.id", ondelete="RESTRICT"), index=True)
    max_priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("100"))
    # Quotas (0015): resource -> nominal amount (`{}` limits nothing); projects of one cohort lend each
    # other what they leave unused, each up to its limits (NULL: no limit). api/dispatcher/quotas.py.
    quota: Mapped[dict[str, float]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    cohort: Mapped[str | None] = mapped_column(String(64))
    borrowing_limit: Mapped[dict[str, float] | None] = mapped_column(JSONB)
    lending_limit: Mapped[dict[str, float] | None] = mapped_column(JSONB)
    # A finished job's unpinned checkpoints are deleted this long after it finished (0018); NULL: kept.
    checkpoint_retention_days: Mapped[float | None] = mapped_column(Double)
    storage_quota_bytes: Mapped[int | None] = mapped_column(BigInteger)  # live checkpoints + code packages


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; `job_id` set means a job-scoped token. `scope`:
    admin (also its project's rights), project, job, metrics (reads /metrics only). A job token is
    written with the hash of a single-use claim and authenticates nothing until its driver claims it
    (`claimed_at`; `claim_hash` then keeps the claim's hash, to catch a claim presented again)."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        Index("ix_api_tokens_claim_hash", "claim_hash", unique=True, postgresql_where=text("claim_hash IS NOT NULL")),
        Index("ix_api_tokens_parent_id", "parent_id", postgresql_where=text("parent_id IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = inserted_at()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    scope: Mapped[str] = mapped_column(String(16), server_default=text("'project'"))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # at most a minute stale
    user_name: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claim_hash: Mapped[str | None] = mapped_column(String(64))
    # The attempt a job token was made for (0016): it authenticates only while that attempt is the latest.
    attempt: Mapped[int | None] = mapped_column(Integer)
    # The token that minted this one through POST /v1/tokens (0027): revoking it revokes this one (a trigger).
    parent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"))
