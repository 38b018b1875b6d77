"""Jobs on the wire: the JobSpec a person submits, the Job the API answers, its attempts, events,
checkpoints and the code upload it runs from."""

from __future__ import annotations

import enum
import json
import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictStr, StringConstraints, Tag, field_validator, model_validator

from trainmaster.models.base import (
    LabelKey,
    LabelValue,
    RequestModel,
    ResourceName,
    ResponseModel,
    StoredRequestModel,
    WholeNumber,
)

MAX_CONFIG_BYTES = 64 * 1024
MAX_NUM_WORKERS = 1024

_ENTRYPOINT = re.compile(
    r"^(?:builtin:[a-z0-9][a-z0-9_-]*"
    r"|script:.+"
    r"|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)$"
)
_CODE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


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


class Framework(str, enum.Enum):
    """Which Ray trainer or launcher runs the entrypoint (workers/frameworks/ has one module each)."""

    torch = "torch"
    tensorflow = "tensorflow"
    jax = "jax"
    horovod = "horovod"
    mpi = "mpi"
    paddle = "paddle"


SCRIPT_ONLY_FRAMEWORKS = frozenset({Framework.mpi, Framework.horovod})  # programs started by mpirun


class Topology(RequestModel):
    """Where a gang's workers go, by a node label (`ray start --labels rack=r1`): `required`, all inside
    one value of that label; `preferred`, inside one if any has room, else across as few as placement
    needs. Exactly one of the two."""

    required: LabelKey | None = None
    preferred: LabelKey | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Topology:
        if (self.required is None) == (self.preferred is None):
            raise ValueError("give exactly one of required or preferred: the node label, e.g. rack")
        return self

    @property
    def label(self) -> str:
        return self.required or self.preferred or ""


Workers = Annotated[WholeNumber, Field(ge=1, le=MAX_NUM_WORKERS)]


class WorkerRange(RequestModel):
    """An elastic gang: admitted when `min` workers fit, grown toward `max` as room frees up, and
    shrunk (not failed) when a node is lost, by Ray Train's elastic policy."""

    min: Workers
    max: Workers

    @model_validator(mode="after")
    def _ordered(self) -> WorkerRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be at most max ({self.max})")
        return self


def _gang_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | WorkerRange) else "integer"


# An integer is a fixed gang, {"min", "max"} an elastic one; an error names which form it read.
GangSize = Annotated[
    Annotated[Workers, Tag("integer")] | Annotated[WorkerRange, Tag("range")], Discriminator(_gang_kind)
]


class Scaling(RequestModel):
    num_workers: GangSize = 1
    use_gpu: bool = Field(default=False, strict=True)
    resources_per_worker: dict[ResourceName, float] | None = None
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK
    topology: Topology | None = None

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

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, WorkerRange)

    @property
    def min_workers(self) -> int:
        """What admission places and accounts at first: the whole gang, or an elastic gang's minimum."""
        return self.num_workers.min if isinstance(self.num_workers, WorkerRange) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers.max if isinstance(self.num_workers, WorkerRange) else self.num_workers

    def worker_resources(self) -> dict[str, float]:
        """What one worker asks of Ray: CPU 1 and one GPU with use_gpu, unless stated otherwise."""
        resources: dict[str, float] = {"CPU": 1.0}
        if self.use_gpu:
            resources["GPU"] = 1.0
        resources.update(self.resources_per_worker or {})
        return resources


class KeepBest(RequestModel):
    """The checkpoint with the best value of `metric` (reported with it) is kept beside the latest ones."""

    metric: str = Field(min_length=1, max_length=256)
    mode: Literal["max", "min"] = "max"


class CheckpointPolicy(RequestModel):
    """What the checkpoint collector keeps of a job's checkpoints: the latest `num_to_keep` (all when
    unset), the best by `keep_best`, and every pinned one; it deletes the rest from storage."""

    num_to_keep: WholeNumber | None = Field(default=None, ge=1)
    keep_best: KeepBest | None = None


class JobSpec(StoredRequestModel):
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
    priority: WholeNumber = Field(default=0, ge=-100, le=100)  # and at most the project's max_priority
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
    def _elastic_needs_torch(self) -> JobSpec:
        if self.scaling.elastic and self.framework is not Framework.torch:
            raise ValueError(
                f"scaling.num_workers: an elastic gang ({{min, max}}) runs under Ray Train's elastic policy, "
                f"which framework {self.framework.value!r} does not have: give an integer, or use framework torch"
            )
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


class Attempt(ResponseModel):
    """One launch. `admitted_at` to `finished_at` is what it held; `running_at`, when its workers
    started. Once it ended, those seconds split into `starting_s`, `productive_s` and `lost_s` (work
    since its last checkpoint thrown away), and `queue_s` is what it waited before admission."""

    n: int
    ray_submission_id: str
    status: AttemptStatus
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    admitted_at: datetime | None = None
    running_at: datetime | None = None
    queue_s: float | None = None
    starting_s: float | None = None
    productive_s: float | None = None
    lost_s: float | None = None


class Job(ResponseModel):
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
    cluster: str | None = None  # the cluster its project is bound to (read only)
    goodput: float | None = None  # productive / allocated seconds over its attempts (None before any ran)


class JobList(ResponseModel):
    items: list[Job]
    next_cursor: str | None = None


class JobEvent(ResponseModel):
    """One event; the same event reported again right after itself is this one counted again:
    `count` times in a row, the first at `created_at`, the latest at `last_at` (None while once)."""

    id: int
    job_id: str
    kind: str
    status: JobStatus | None = None
    message: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    count: int = 1
    last_at: datetime | None = None


class JobControl(ResponseModel):
    """What the platform asks of a running job's code (read with the job token)."""

    checkpoint: bool = False  # checkpoint now: the job is being preempted and will be stopped
    reason: str | None = None
    # An elastic gang asked to shrink to make room for a higher-priority job: run at most this many
    # workers (its scaling policy reads it and resizes the gang, from its latest checkpoint).
    max_workers: int | None = None


REPORTED_JSON_MAX = 16 * 1024  # what a job attaches to one event or checkpoint: every list of them holds it


def _small_json(field: str, value: dict[str, Any]) -> dict[str, Any]:
    if len(json.dumps(value, default=str)) > REPORTED_JSON_MAX:
        raise ValueError(f"{field} must be at most 16 KiB as JSON")
    return value


class JobEventIn(StoredRequestModel):
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
        return _small_json("data", value)


class EventList(ResponseModel):
    """A page of a job's events, oldest first. `next_after_id`: where the next page starts (pass it as
    `after_id`) when this one may not be the last: it stopped at `limit` or at the bytes a page holds."""

    items: list[JobEvent]
    next_after_id: int | None = None


class CheckpointIn(StoredRequestModel):
    path: str = Field(min_length=1, max_length=4096)
    step: int | None = Field(default=None, ge=0)
    metrics: dict[str, Any] = Field(default_factory=dict)
    size_bytes: int | None = Field(default=None, ge=0, le=2**62)  # what its folder holds (local storage)

    @field_validator("metrics")
    @classmethod
    def _metrics_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _small_json("metrics", value)


class CheckpointInfo(ResponseModel):
    id: int
    attempt: int | None = None
    path: str
    step: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    pinned: bool = False  # kept whatever the policy and the retention say
    deleted_at: datetime | None = None  # removed from storage (the row stays), and why
    deleted_why: str | None = None
    size_bytes: int | None = None  # what the storage quota counts: as reported until measured, then measured
    size_measured_at: datetime | None = None  # when the platform last measured it; None: the job's figure


class CheckpointList(ResponseModel):
    """A page of a job's checkpoints, oldest first; `next_after_id` as EventList's."""

    items: list[CheckpointInfo]
    next_after_id: int | None = None


class CodeUpload(ResponseModel):
    id: str
    size: int
    file_count: int = 0
