"""SQLAlchemy 2.0 models: the one source the Alembic revisions are checked against.

Over 400 lines on purpose: every table in one module, on one MetaData, which is what Alembic's
comparison (tests/integration/test_migrations.py) reads; the tables point at each other, so split by
domain the modules would import each other in a circle."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Computed,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from api.queues.sql import SHARE_COLUMN
from trainmaster.models import AttemptStatus, JobStatus, SweepStatus

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

job_status_enum = Enum(
    JobStatus, name="job_status", values_callable=lambda e: [m.value for m in e], validate_strings=True
)
attempt_status_enum = Enum(
    AttemptStatus, name="attempt_status", values_callable=lambda e: [m.value for m in e], validate_strings=True
)
sweep_status_enum = Enum(
    SweepStatus, name="sweep_status", values_callable=lambda e: [m.value for m in e], validate_strings=True
)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    __mapper_args__ = {"eager_defaults": True}  # server defaults come back with RETURNING


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


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
    created_at: Mapped[datetime] = _now()


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
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
    created_at: Mapped[datetime] = _now()
    # The same event again right after itself is this row counted once more (0012, record_event).
    count: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    last_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the latest repeat's time


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_job_id_seq", "job_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # A job's id, kept as a foreign key to jobs with ON DELETE CASCADE would keep it, by statement
    # triggers that check once per batch instead of once per point (migration 0009).
    job_id: Mapped[uuid.UUID] = mapped_column(UUID)
    attempt: Mapped[int | None] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    step: Mapped[int | None] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(256))
    value: Mapped[float] = mapped_column(Double)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class MetricBlock(Base):
    """The minimum and maximum point of each name and rank per block of 4096 sequence numbers
    (`seq >> 12`), kept by a statement trigger on metric_points, so a downsampled read of millions of
    points reads thousands of blocks. `stepped` counts the points that have a step."""

    __tablename__ = "metric_blocks"

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    block: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    stepped: Mapped[int] = mapped_column(Integer)
    min_step: Mapped[int | None] = mapped_column(BigInteger)
    max_step: Mapped[int | None] = mapped_column(BigInteger)
    lo_value: Mapped[float] = mapped_column(Double)
    lo_seq: Mapped[int] = mapped_column(BigInteger)
    lo_step: Mapped[int | None] = mapped_column(BigInteger)
    lo_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    hi_value: Mapped[float] = mapped_column(Double)
    hi_seq: Mapped[int] = mapped_column(BigInteger)
    hi_step: Mapped[int | None] = mapped_column(BigInteger)
    hi_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))


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


class UsageFigures:
    """The columns usage_hours and usage_days share: ended attempts' resource-seconds per project, UTC
    hour or day (of the attempt's end) and user, kept by the trigger tm_attempt_ended (0017)."""

    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(128), primary_key=True, server_default=text("''"))
    attempts: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    queue_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    cpu_starting_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    cpu_productive_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    cpu_lost_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    gpu_starting_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    gpu_productive_s: Mapped[float] = mapped_column(Double, server_default=text("0"))
    gpu_lost_s: Mapped[float] = mapped_column(Double, server_default=text("0"))


class UsageHour(UsageFigures, Base):
    """`GET /v1/usage` reads the partial days at a range's ends here."""

    __tablename__ = "usage_hours"
    __table_args__ = (Index("ix_usage_hours_hour", "hour"),)

    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)


class UsageDay(UsageFigures, Base):
    """`GET /v1/usage` reads whole days here."""

    __tablename__ = "usage_days"
    __table_args__ = (Index("ix_usage_days_day", "day"),)

    day: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)


class ProjectUsage(Base):
    """CPUs and GPUs held by each project's active jobs (starting, running, cancelling), kept by a
    deferred trigger on jobs: fair share reads one row per project instead of summing active jobs.
    Numeric, so adding and taking away fractions returns exactly to zero."""

    __tablename__ = "project_usage"
    __table_args__ = (CheckConstraint("active >= 0", name="active_not_negative"),)

    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    active: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[float] = mapped_column(Numeric(asdecimal=False))
    cpus: Mapped[float] = mapped_column(Numeric(asdecimal=False))
    # Fair sharing (0020): the project's share of the cluster's CPUs and GPUs averaged with a half-life,
    # sampled by admission rounds (SAMPLE_FAIR_SHARE, api/dispatcher/repository.py) against the
    # capacities then; `share`, its dominant share (history plus what it holds now: api/queues/sql.py).
    history_cpus: Mapped[float] = mapped_column(Double, server_default=text("0"))
    history_gpus: Mapped[float] = mapped_column(Double, server_default=text("0"))
    # How much of a full history the samples cover (0025): the histories average over that time alone.
    history_weight: Mapped[float] = mapped_column(Double, server_default=text("0"))
    cpu_capacity: Mapped[float | None] = mapped_column(Numeric(asdecimal=False))
    gpu_capacity: Mapped[float | None] = mapped_column(Numeric(asdecimal=False))
    sampled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), server_default=func.now())
    share: Mapped[float] = mapped_column(
        Double,
        Computed(
            SHARE_COLUMN,
            persisted=True,
        ),
    )


class MetricBatch(Base):
    """Batches already stored, so a sender's retry after a lost answer stores nothing twice."""

    __tablename__ = "metric_batches"

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    points: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()


class LogLine(Base):
    __tablename__ = "log_lines"
    __table_args__ = (Index("ix_log_lines_job_id_seq", "job_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(64))
    line: Mapped[str] = mapped_column(Text)
    ts: Mapped[datetime] = _now()


class ProjectStorage(Base):
    """Bytes each project stores: its live checkpoints (and how many) and its code packages, kept by
    statement triggers on checkpoints and code_packages (migration 0019)."""

    __tablename__ = "project_storage"

    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    checkpoint_bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    checkpoints: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    code_bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class CodePackage(Base):
    """A zipped working directory, content-addressed (sha256 of the archive) within a project."""

    __tablename__ = "code_packages"

    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(71), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    file_count: Mapped[int] = mapped_column(Integer)
    content: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _now()


class Checkpoint(Base):
    """A checkpoint a job reported. Deleted from storage by the collector (api/checkpoints/lifecycle.py:
    the job's policy, its project's retention), the row stays with `deleted_at` and why (0018)."""

    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("job_id", "path"),
        Index("ix_checkpoints_live", "job_id", "id", postgresql_where=text("deleted_at IS NULL")),
        Index("ix_checkpoints_measured", "size_measured_at", "id", postgresql_where=text("deleted_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int | None] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    pinned: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deleted_why: Mapped[str | None] = mapped_column(Text)
    # What its folder holds: as the job reported it (0019) until the platform measures it, then measured
    # (api/checkpoints/sizes.py, 0028), `size_measured_at` saying when.
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    size_measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Sweep(Base):
    """A hyperparameter sweep: `request` is the SweepSpec as submitted; its trials are jobs."""

    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_project_id_created_at_id", "project_id", text("created_at DESC"), text("id DESC")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, default=uuid.uuid4)
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[SweepStatus] = mapped_column(sweep_status_enum, index=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)
    parameter_names: Mapped[list[str]] = mapped_column(JSONB)  # JSONB objects do not keep key order
    max_trials: Mapped[int] = mapped_column(Integer)
    max_concurrent: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When a controller round last picked it (0011): rounds serve the least recently served first.
    served_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SweepTrial(Base):
    """One trial: its job, its parameters, and what the controller has read of its metric so far."""

    __tablename__ = "sweep_trials"

    sweep_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSONB)
    metric_seq: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))  # metric_points read up to
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    last_value: Mapped[float | None] = mapped_column(Double)
    milestones: Mapped[dict[str, float | None]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    stopped_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
