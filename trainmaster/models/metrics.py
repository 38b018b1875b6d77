"""What a running job streams back: metric batches in, stored metric values and log lines out."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from pydantic import Field, model_validator

from trainmaster.models.base import RequestModel, ResponseModel

# The columns' ranges (bigint step, integer rank and attempt): a value past them is a 422, not a failed insert.
MAX_STEP = 2**63 - 1
MAX_RANK = MAX_ATTEMPT = 2**31 - 1


class MetricPoint(RequestModel):
    """One logged step: several named values. NaN and infinities are kept (a diverging loss is news)."""

    step: int | None = Field(default=None, ge=0, le=MAX_STEP)
    values: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[float, Field(allow_inf_nan=True)]]
    rank: int = Field(default=0, ge=0, le=MAX_RANK)
    ts: datetime | None = None


MAX_POINTS_PER_BATCH = 20_000


class MetricBatchIn(RequestModel):
    """`batch_id` makes a retried send idempotent: a batch already stored is not stored again."""

    batch_id: uuid.UUID | None = None
    attempt: int | None = Field(default=None, ge=1, le=MAX_ATTEMPT)
    points: list[MetricPoint] = Field(max_length=MAX_POINTS_PER_BATCH)

    @model_validator(mode="after")
    def _no_nul_in_names(self) -> MetricBatchIn:
        # Values are numbers; names are the only strings stored (cheaper than walking every point).
        for index, point in enumerate(self.points):
            for name in point.values:
                if "\x00" in name:
                    raise ValueError(f"points[{index}].values has a name with a NUL character (\\u0000)")
        return self


class MetricBatchAck(ResponseModel):
    stored: int
    duplicate: bool = False


class MetricValue(ResponseModel):
    seq: int
    step: int | None = None
    rank: int = 0
    name: str
    value: float | None  # null for NaN and infinities, which JSON cannot carry
    ts: datetime


class MetricList(ResponseModel):
    items: list[MetricValue]


class LogLine(ResponseModel):
    seq: int
    attempt: int | None = None
    source: str
    line: str
    ts: datetime


class LogList(ResponseModel):
    """A page of stored lines. `next_after_seq`: where the next page starts (pass it as `after_seq`)
    when this one may not be the last: it stopped at `limit`, or at the bytes one page may hold."""

    items: list[LogLine]
    next_after_seq: int | None = None
