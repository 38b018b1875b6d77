"""Hyperparameter sweeps and their trials (each trial a job)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Double, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from api.db.models.base import Base, inserted_at, sweep_status_enum
from trainmaster.models import SweepStatus


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
    created_at: Mapped[datetime] = inserted_at()
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
    created_at: Mapped[datetime] = inserted_at()
