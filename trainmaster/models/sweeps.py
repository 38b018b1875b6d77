"""Hyperparameter sweeps: the SweepSpec a person sends, the Sweep and its trials the API answers."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from trainmaster.models.base import RequestModel, ResponseModel, StoredRequestModel, WholeNumber
from trainmaster.models.jobs import JobSpec

MAX_SWEEP_TRIALS = 1000


class SweepStatus(str, enum.Enum):
    running = "running"
    completed = "completed"
    failed = "failed"  # every trial failed or timed out
    cancelled = "cancelled"


class SweepParameter(RequestModel):
    """One of: `{"values": [...]}`, `{"uniform": [low, high]}`, `{"log_uniform": [low, high]}`."""

    values: list[Any] | None = Field(default=None, min_length=1, max_length=1000)
    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SweepParameter:
        given = [k for k in ("values", "uniform", "log_uniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of values, uniform, log_uniform")
        low, high = self.uniform or self.log_uniform or (0.0, 1.0)
        if not low < high:
            raise ValueError(f"the range [{low}, {high}] must have low < high")
        if self.log_uniform is not None and low <= 0:
            raise ValueError("log_uniform needs low > 0")
        return self


class EarlyStopping(RequestModel):
    """`asha`: at steps grace·rf^k a trial continues only in the top 1/rf of those seen there;
    `median`: at steps k·grace a trial stops when worse than the median of the others there."""

    policy: Literal["asha", "median", "none"] = "none"
    grace_steps: WholeNumber = Field(default=1, ge=1, le=1_000_000)
    reduction_factor: WholeNumber = Field(default=3, ge=2, le=100)


class SweepSpec(StoredRequestModel):
    name: str = Field(min_length=1, max_length=128)
    spec: JobSpec
    parameters: dict[Annotated[str, Field(min_length=1, max_length=128)], SweepParameter] = Field(
        min_length=1, max_length=64
    )
    max_trials: WholeNumber | None = Field(default=None, ge=1, le=MAX_SWEEP_TRIALS)
    max_concurrent: WholeNumber | None = Field(default=None, ge=1, le=MAX_SWEEP_TRIALS)
    metric: str = Field(min_length=1, max_length=256)
    mode: Literal["min", "max"] = "min"
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    seed: WholeNumber | None = Field(default=None, ge=0, le=2**62)

    @property
    def is_grid(self) -> bool:
        return all(p.values is not None for p in self.parameters.values())


class SweepTrial(ResponseModel):
    n: int
    job_id: str
    params: dict[str, Any]
    status: str  # the job's status, or "stopped" when the sweep stopped it early
    metric: float | None = None  # the last reported value of the sweep's metric
    step: int | None = None
    stopped_reason: str | None = None


class Sweep(ResponseModel):
    id: str
    project: str
    name: str
    status: SweepStatus
    metric: str
    mode: Literal["min", "max"]
    max_trials: int
    max_concurrent: int
    early_stopping: dict[str, Any]
    parameters: dict[str, Any]
    error: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    trial_counts: dict[str, int] = Field(default_factory=dict)  # by trial status
    trials: list[SweepTrial] = Field(default_factory=list)  # ranked by the metric, best first; not in lists
    best: SweepTrial | None = None


class SweepList(ResponseModel):
    items: list[Sweep]
