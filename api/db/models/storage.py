"""What projects store: checkpoints, code packages, and the bytes of both a trigger counts per project."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from api.db.models.base import Base, inserted_at


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
    created_at: Mapped[datetime] = inserted_at()


class Checkpoint(Base):
    """A checkpoint a job reported. Deleted from storage by the collector (api/dispatcher/checkpoint_collector.py:
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
    created_at: Mapped[datetime] = inserted_at()
    pinned: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deleted_why: Mapped[str | None] = mapped_column(Text)
    # What its folder holds: as the job reported it (0019) until the platform measures it, then measured
    # (api/dispatcher/checkpoint_sizes.py, 0028), `size_measured_at` saying when.
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    size_measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
