"""trainmaster: submit PyTorch training jobs to a Ray cluster and watch them live."""

from trainmaster.admin import Admin
from trainmaster.async_client import AsyncClient, AsyncJobHandle
from trainmaster.client import Client, JobHandle
from trainmaster.control import should_checkpoint
from trainmaster.errors import (
    AmbiguousJobId,
    ApiError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    JobFailed,
    JobNotFound,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TrainmasterError,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
)
from trainmaster.metrics import flush, log
from trainmaster.models import (
    Attempt,
    CheckpointPolicy,
    Framework,
    Job,
    JobEvent,
    JobSpec,
    JobStatus,
    KeepBest,
    PlacementStrategy,
    Scaling,
    Topology,
)

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AmbiguousJobId",
    "ApiError",
    "AsyncClient",
    "AsyncJobHandle",
    "Attempt",
    "CheckpointPolicy",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "Framework",
    "Job",
    "JobEvent",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
    "JobStatus",
    "KeepBest",
    "NotFound",
    "PayloadTooLarge",
    "PlacementStrategy",
    "Scaling",
    "ServiceUnavailable",
    "Topology",
    "TrainmasterError",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimeout",
    "flush",
    "log",
    "should_checkpoint",
]
