"""What running jobs send: metric points (with the per-block summaries downsampled reads use and
the batches already stored) and log lines."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Double, ForeignKey, Identity, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from api.db.models.base import Base, inserted_at


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


class MetricBatch(Base):
    """Batches already stored, so a sender's retry after a lost answer stores nothing twice."""

    __tablename__ = "metric_batches"

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    points: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = inserted_at()


class LogLine(Base):
    __tablename__ = "log_lines"
    __table_args__ = (Index("ix_log_lines_job_id_seq", "job_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(64))
    line: Mapped[str] = mapped_column(Text)
    ts: Mapped[datetime] = inserted_at()
