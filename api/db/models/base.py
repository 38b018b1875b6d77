"""What every table shares: one `Base` on one MetaData with a naming convention (so constraint
names are stable in migrations), the status enums as PostgreSQL types, and the `created_at` column."""

from __future__ import annotations

from typing import Any

from sqlalchemy import DateTime, Enum, MetaData, func
from sqlalchemy.orm import DeclarativeBase, mapped_column

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


def inserted_at() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)
