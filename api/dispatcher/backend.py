"""What the dispatcher needs from Ray, behind a small interface (a fake stands in for unit tests)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from api.dispatcher.placement import ClusterCapacity


class RayJobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (RayJobState.STOPPED, RayJobState.SUCCEEDED, RayJobState.FAILED)


@dataclass(frozen=True)
class RayJobInfo:
    state: RayJobState
    message: str = ""
    end_time: datetime | None = None  # when Ray saw the job end (terminal states only)
    driver_job_id: str | None = None  # the Ray job id of its driver (what its placement groups name)
    exit_code: int | None = None  # the entrypoint's, once it ended (negative: the signal that killed it)


@dataclass
class Launch:
    """One attempt to start: everything the Jobs API needs, built by the platform."""

    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    # The uploaded code package (sha256 digest) of the job's project, unpacked into the working_dir
    # just before the submit: never inside an admission transaction (launch.with_code).
    code: str | None = None
    project_id: str = ""
    # Why this launch cannot be made at all (found while building it): it is failed, never sent.
    refusal: str | None = None

    @property
    def log_fields(self) -> dict[str, str | int]:
        """What a log line about this launch carries (its `extra`)."""
        return {
            "job_id": self.metadata.get("trainmaster_job_id", ""),
            "attempt": int(self.metadata.get("attempt", 0)),
            "project_id": self.project_id,
            "submission_id": self.submission_id,
        }


@dataclass(frozen=True)
class GangState:
    """A driver's placement groups as Ray holds them: whether one is placed (CREATED), and, for one Ray
    leaves pending, Ray's own words for why (its scheduling state). `workers`: the bundles of the placed
    group (Ray Train places one per worker), what the gang holds whatever the job reports."""

    placed: bool = False
    pending: str | None = None
    workers: int | None = None


class RayUnavailable(Exception):
    """Ray's head could not be reached; try again later."""


class LaunchRefused(Exception):
    """Ray refused this one launch for a reason of its own (its runtime environment, its size, a
    request Ray calls invalid): sending it again gets the same answer, so its job fails with this."""


class RayBackend(Protocol):
    def cluster(self) -> ClusterCapacity:
        """Nodes with their total and free resources."""
        ...

    def submit(self, launch: Launch) -> bool:
        """Submit; True if this call started it, False if Ray already knew the submission id.
        Raises RayUnavailable (try again later) or LaunchRefused (never: fail the job)."""
        ...

    def info(self, submission_id: str) -> RayJobInfo | None:
        """The job's state, or None when Ray does not know the id (e.g. after a cluster restart)."""
        ...

    def stop(self, submission_id: str) -> None: ...

    def gang_state(self, driver_job_id: str) -> GangState:
        """The placement groups this driver created: placed (CREATED), or pending and why."""
        ...

    def logs(self, submission_id: str, offset: int = 0, final: bool = False) -> str:
        """What the Ray job printed (driver and forwarded worker output) after its first `offset`
        characters; `final` once the job ended, when the rest must be complete."""
        ...
