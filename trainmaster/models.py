"""Wire models shared by the SDK, the CLI and the API.

Request models (what a person sends) forbid unknown fields, so a typo never silently does nothing.
Response models ignore fields they do not know, so an older SDK keeps working against a newer server.

Longer than most files (about 500 lines) on purpose: this is the public contract of every REST
body, jobs, events, metrics, logs, cluster and sweeps alike, and one file keeps the shared
validators (names, NUL checks, bounds) in one place. Split it by domain when a domain grows its own
validators.
"""

from __future__ import annotations

import enum
import json
import math
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)

MAX_CONFIG_BYTES = 64 * 1024
MAX_NUM_WORKERS = 1024

_ENTRYPOINT = re.compile(
    r"^(?:builtin:[a-z0-9][a-z0-9_-]*"
    r"|script:.+"
    r"|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
)
_CODE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def _not_text(value: Any) -> Any:
    # JSON 2.0 is an integer to JSON Schema, so whole floats pass; strings and booleans do not.
    if isinstance(value, str | bool):
        raise ValueError("must be a number, not a string or a boolean")
    return value


WholeNumber = Annotated[int, BeforeValidator(_not_text)]
LabelKey = Annotated[StrictStr, StringConstraints(min_length=1, max_length=63)]
LabelValue = Annotated[StrictStr, StringConstraints(max_length=256)]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class JobStatus(str, enum.Enum):
    queued = "queued"
    starting = "starting"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timed_out = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled, JobStatus.timed_out})


class AttemptStatus(str, enum.Enum):
    """One launch of a job on Ray. `pending`: the row is committed, Ray may not have heard of it yet
    (submitting the same id again is safe); `timing_out`: the dispatcher asked Ray to stop it."""

    pending = "pending"
    submitted = "submitted"
    running = "running"
    timing_out = "timing_out"
    succeeded = "succeeded"
    failed = "failed"
    lost = "lost"
    stopped = "stopped"
    timed_out = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in (
            AttemptStatus.succeeded,
            AttemptStatus.failed,
            AttemptStatus.lost,
            AttemptStatus.stopped,
            AttemptStatus.timed_out,
        )


class PlacementStrategy(str, enum.Enum):
    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


def _nul_path(value: Any, path: str = "") -> str | None:
    """Where a NUL character hides in a JSON value (PostgreSQL text and JSONB cannot store it)."""
    if isinstance(value, str):
        return path or "value" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and "\x00" in key:
                return where
            if (found := _nul_path(item, where)) is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _nul_path(item, f"{path}[{index}]")) is not None:
                return found
    return None


class Framework(str, enum.Enum):
    """Which Ray trainer or launcher runs the entrypoint (workers/frameworks/ has one module each)."""

    torch = "torch"
    tensorflow = "tensorflow"
    jax = "jax"
    horovod = "horovod"
    mpi = "mpi"
    paddle = "paddle"


SCRIPT_ONLY_FRAMEWORKS = frozenset({Framework.mpi, Framework.horovod})  # programs started by mpirun


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _StoredRequest(_Request):
    """A request whose strings are stored: refuse NUL characters anywhere in it, naming where.

    Only on top-level bodies: the check walks the whole input, once.
    """

    @model_validator(mode="before")
    @classmethod
    def _no_nul_characters(cls, data: Any) -> Any:
        if (where := _nul_path(data)) is not None:
            raise ValueError(f"{where} contains a NUL character (\\u0000), which cannot be stored")
        return data


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Scaling(_Request):
    num_workers: WholeNumber = Field(default=1, ge=1, le=MAX_NUM_WORKERS)
    use_gpu: bool = Field(default=False, strict=True)
    resources_per_worker: dict[ResourceName, float] | None = None
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK

    @field_validator("resources_per_worker")
    @classmethod
    def _resources_are_positive(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        for name, amount in value.items():
            if not math.isfinite(amount):
                raise ValueError(f"{name} must be a finite number")
            if name == "GPU":
                if amount < 0:
                    raise ValueError("GPU must be >= 0")
            elif amount <= 0:
                raise ValueError(f"{name} must be > 0")
        return value

    def worker_resources(self) -> dict[str, float]:
        """What one worker asks of Ray: CPU 1 and one GPU with use_gpu, unless stated otherwise."""
        resources: dict[str, float] = {"CPU": 1.0}
        if self.use_gpu:
            resources["GPU"] = 1.0
        resources.update(self.resources_per_worker or {})
        return resources


class CheckpointPolicy(_Request):
    num_to_keep: WholeNumber | None = Field(default=None, ge=1)


class JobSpec(_StoredRequest):
    name: str = Field(min_length=1, max_length=128)
    entrypoint: str = Field(min_length=1, max_length=512, json_schema_extra={"pattern": _ENTRYPOINT.pattern})
    args: list[StrictStr] = Field(default_factory=list, max_length=1024)
    config: dict[str, Any] = Field(default_factory=dict)
    code: Annotated[str, StringConstraints(pattern=_CODE_ID.pattern)] | None = None
    scaling: Scaling = Field(default_factory=Scaling)
    framework: Framework = Framework.torch
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    pip: list[StrictStr] = Field(default_factory=list, max_length=256)
    max_retries: WholeNumber = Field(default=0, ge=0, le=10)
    max_failures: WholeNumber = Field(default=0, ge=0, le=100)
    timeout_s: float | None = Field(default=None, gt=0)
    priority: WholeNumber = Field(default=0, ge=-100, le=100)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, value: str) -> str:
        if not _ENTRYPOINT.match(value):
            raise ValueError("entrypoint must be 'pkg.module:function', 'script:path/train.py' or 'builtin:<name>'")
        return value

    @field_validator("config")
    @classmethod
    def _config_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except ValueError as exc:
            raise ValueError("config must be JSON without NaN or infinity") from exc
        if len(encoded.encode()) > MAX_CONFIG_BYTES:
            raise ValueError(f"config is {len(encoded.encode())} bytes encoded; the limit is {MAX_CONFIG_BYTES}")
        return value

    @model_validator(mode="after")
    def _backend_matches_devices(self) -> JobSpec:
        if self.backend == "nccl" and not self.uses_gpu:
            raise ValueError("backend 'nccl' needs GPUs: set scaling.use_gpu or resources_per_worker.GPU")
        return self

    @model_validator(mode="after")
    def _entrypoint_fits_framework(self) -> JobSpec:
        if self.framework is Framework.torch:
            return self
        if self.entrypoint.startswith("builtin:"):
            raise ValueError(
                f"built-in templates are PyTorch code: framework {self.framework.value!r} takes a script or a function"
            )
        if self.framework in SCRIPT_ONLY_FRAMEWORKS and not self.entrypoint.startswith("script:"):
            raise ValueError(
                f"framework {self.framework.value!r} starts a program under mpirun: entrypoint must be 'script:…'"
            )
        return self

    @property
    def uses_gpu(self) -> bool:
        return self.scaling.worker_resources().get("GPU", 0) > 0

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.uses_gpu else "gloo"


class Attempt(_Response):
    n: int
    ray_submission_id: str
    status: AttemptStatus
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None


class Job(_Response):
    id: str
    project: str
    name: str
    status: JobStatus
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    pending_reason: str | None = None
    error: str | None = None
    latest_metrics: dict[str, Any] | None = None
    queue_position: int | None = None


class JobList(_Response):
    items: list[Job]
    next_cursor: str | None = None


class JobEvent(_Response):
    id: int
    job_id: str
    kind: str
    status: JobStatus | None = None
    message: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class JobControl(_Response):
    """What the platform asks of a running job's code (read with the job token)."""

    checkpoint: bool = False  # checkpoint now: the job is being preempted and will be stopped
    reason: str | None = None


class JobEventIn(_StoredRequest):
    """A notable event reported from inside a job (runtime placement, topology, dropped points)."""

    kind: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    message: str | None = Field(default=None, max_length=4096)
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("kind")
    @classmethod
    def _not_status(cls, value: str) -> str:
        if value == "status":
            raise ValueError("status events are written by the platform only")
        return value

    @field_validator("data")
    @classmethod
    def _data_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value, default=str)) > 16 * 1024:
            raise ValueError("data must be at most 16 KiB as JSON")
        return value


class EventList(_Response):
    items: list[JobEvent]


# The columns' ranges (bigint step, integer rank and attempt): a value past them is a 422, not a failed insert.
MAX_STEP = 2**63 - 1
MAX_RANK = MAX_ATTEMPT = 2**31 - 1


class MetricPoint(_Request):
    """One logged step: several named values. NaN and infinities are kept (a diverging loss is news)."""

    step: int | None = Field(default=None, ge=0, le=MAX_STEP)
    values: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[float, Field(allow_inf_nan=True)]]
    rank: int = Field(default=0, ge=0, le=MAX_RANK)
    ts: datetime | None = None


MAX_POINTS_PER_BATCH = 20_000


class MetricBatchIn(_Request):
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


class MetricBatchAck(_Response):
    stored: int
    duplicate: bool = False


class MetricValue(_Response):
    seq: int
    step: int | None = None
    rank: int = 0
    name: str
    value: float | None  # null for NaN and infinities, which JSON cannot carry
    ts: datetime


class MetricList(_Response):
    items: list[MetricValue]


class LogLine(_Response):
    seq: int
    attempt: int | None = None
    source: str
    line: str
    ts: datetime


class LogList(_Response):
    items: list[LogLine]


class CheckpointIn(_StoredRequest):
    path: str = Field(min_length=1, max_length=4096)
    step: int | None = Field(default=None, ge=0)
    metrics: dict[str, Any] = Field(default_factory=dict)


class CheckpointInfo(_Response):
    id: int
    attempt: int | None = None
    path: str
    step: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class CheckpointList(_Response):
    items: list[CheckpointInfo]


class CodeUpload(_Response):
    id: str
    size: int
    file_count: int = 0


class ClusterNode(_Response):
    node_id: str
    ip: str | None = None
    total: dict[str, float]
    free: dict[str, float]


class ClusterInfo(_Response):
    reachable: bool
    error: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)
    total: dict[str, float] = Field(default_factory=dict)
    free: dict[str, float] = Field(default_factory=dict)
    queue_depth: int = 0
    project_queue_depth: int = 0


class ErrorBody(_Response):
    error: str
    detail: Any = None


# -- sweeps ---------------------------------------------------------------------------------------

MAX_SWEEP_TRIALS = 1000


class SweepStatus(str, enum.Enum):
    running = "running"
    completed = "completed"
    failed = "failed"  # every trial failed or timed out
    cancelled = "cancelled"


class SweepParameter(_Request):
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


class EarlyStopping(_Request):
    """`asha`: at steps grace·rf^k a trial continues only in the top 1/rf of those seen there;
    `median`: at steps k·grace a trial stops when worse than the median of the others there."""

    policy: Literal["asha", "median", "none"] = "none"
    grace_steps: WholeNumber = Field(default=1, ge=1, le=1_000_000)
    reduction_factor: WholeNumber = Field(default=3, ge=2, le=100)


class SweepSpec(_StoredRequest):
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


class SweepTrial(_Response):
    n: int
    job_id: str
    params: dict[str, Any]
    status: str  # the job's status, or "stopped" when the sweep stopped it early
    metric: float | None = None  # the last reported value of the sweep's metric
    step: int | None = None
    stopped_reason: str | None = None


class Sweep(_Response):
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


class SweepList(_Response):
    items: list[Sweep]
