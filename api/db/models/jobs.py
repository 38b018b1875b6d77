"""Jobs, their attempts and events, and the queue counts a trigger keeps of the queued ones."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column, relationship

from api.db.models.base import Base, attempt_status_enum, inserted_at, job_status_enum
from api.db.models.tenancy import Project
from trainmaster.models import AttemptStatus, JobStatus


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key"),
        Index("ix_jobs_project_id_created_at_id", "project_id", text("created_at DESC"), text("id DESC")),
        Index("ix_jobs_queue", "priority", "created_at", postgresql_where=text("status = 'queued'")),
        Index("ix_jobs_labels", "labels", postgresql_using="gin"),
        # Scale (0005): a status-filtered page, each project's queue in its own order, retention's work list.
        Index(
            "ix_jobs_project_id_status_created_at_id", "project_id", "status", text("created_at DESC"), text("id DESC")
        ),
        Index(
            "ix_jobs_queued_by_project",
            "project_id",
            text("priority DESC"),
            "created_at",
            "id",
            postgresql_where=text("status = 'queued'"),
            postgresql_include=["gang_cpus", "gang_gpus"],  # 0026: each project's running sums, index-only
        ),
        Index(
            "ix_jobs_unpurged_finished_at",
            "finished_at",
            postgresql_where=text("purged_at IS NULL AND finished_at IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[JobStatus] = mapped_column(job_status_enum, index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    user_name: Mapped[str | None] = mapped_column(String(128))  # the submitting token's user (0017)
    gang_cpus: Mapped[float] = mapped_column(Double, server_default=text("0"))
    gang_gpus: Mapped[float] = mapped_column(Double, server_default=text("0"))
    idempotency_key: Mapped[str | None] = mapped_column(String(256))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    pending_reason: Mapped[str | None] = mapped_column(Text)
    infeasible_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When a later job of its project was first admitted while it waited for resources (0024): past
    # `starvation_s`, it holds admission until it fits (api/dispatcher/decide.py).
    bypassed_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Set while a higher-priority job waits for this one to checkpoint and stop (preemption).
    preempted_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    preempt_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # An elastic gang asked to shrink to make room (0023): at most this many workers for the attempt.
    shrink_to: Mapped[int | None] = mapped_column(Integer)
    shrink_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = inserted_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # retention dropped its points and logs

    project: Mapped[Project] = relationship(lazy="raise")
    attempts: Mapped[list[JobAttempt]] = relationship(lazy="raise", order_by="JobAttempt.n", back_populates="job")


class JobAttempt(Base):
    __tablename__ = "job_attempts"
    __table_args__ = (UniqueConstraint("job_id", "n"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    n: Mapped[int] = mapped_column(Integer)
    ray_submission_id: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[AttemptStatus] = mapped_column(attempt_status_enum)
    error: Mapped[str | None] = mapped_column(Text)
    log_offset: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created_at: Mapped[datetime] = inserted_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Accounting (0017): when its workers started; the seconds the trigger tm_attempt_ended writes as it ends.
    running_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    queue_s: Mapped[float | None] = mapped_column(Double)
    starting_s: Mapped[float | None] = mapped_column(Double)
    productive_s: Mapped[float | None] = mapped_column(Double)
    lost_s: Mapped[float | None] = mapped_column(Double)
    # The node-label domain admission placed the gang inside (`scaling.topology`, 0021), e.g. {"rack": "r2"}.
    selector: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    # Why it ended where that is not the job's failure (0030; api/dispatcher/ending.py, AttemptEnd).
    ended_as: Mapped[str | None] = mapped_column(Text)

    job: Mapped[Job] = relationship(lazy="raise", back_populates="attempts")


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(64))
    status: Mapped[JobStatus | None] = mapped_column(job_status_enum)
    message: Mapped[str | None] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = inserted_at()
    # The same event again right after itself is this row counted once more (0012, record_event).
    count: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    last_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the latest repeat's time


class QueueCount(Base):
    """Queued jobs per priority and project and their gangs summed, kept by a deferred trigger on jobs.
    Each job counts in one of 8 shards (by its id) so concurrent submissions of one project do not queue
    on one row."""

    __tablename__ = "queue_counts"

    priority: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    queued: Mapped[int] = mapped_column(Integer)
    # 0026: their gangs, in whole thousandths of a CPU or GPU (integers: sums exact in any order)
    cpu_millis: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    gpu_millis: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
