"""Accounting that triggers keep: what each project's active jobs hold now (fair share reads it),
and ended attempts' resource-seconds per hour and day (`GET /v1/usage`)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Computed,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    Numeric,
    String,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from api.db.models.base import Base
from api.queues.sql import SHARE_COLUMN


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
