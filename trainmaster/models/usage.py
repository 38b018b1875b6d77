"""Usage as `GET /v1/usage` reports it: resource-hours of ended attempts, split into what started,
trained and was lost, and time queued, per project, user, job or label."""

from __future__ import annotations

from datetime import datetime

from trainmaster.models.base import ResponseModel


class Hours(ResponseModel):
    """Resource-hours (CPU x hours, or GPU x hours): allocated = starting + productive + lost."""

    allocated: float = 0.0
    starting: float = 0.0
    productive: float = 0.0
    lost: float = 0.0


class UsageRow(ResponseModel):
    key: str  # the project, user, job id or label value grouped by ("" for none)
    period: datetime | None = None  # the hour or day, with `granularity`
    attempts: int = 0
    cpu_hours: Hours = Hours()
    gpu_hours: Hours = Hours()
    queue_hours: float = 0.0
    goodput: float | None = None  # productive / allocated, GPU-hours where any, else CPU-hours


class UsageReport(ResponseModel):
    group_by: str
    granularity: str | None = None
    start: datetime
    end: datetime
    items: list[UsageRow]
