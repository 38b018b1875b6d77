"""Who is calling: what `authenticate` (service.py) answers and the token cache (cache.py) keeps."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """What a token may do. `admin` manages clusters, projects and tokens and acts as a project token of
    its own project; `project` is a project's; `job` writes one job's metrics, events and checkpoint
    records (the platform's own, made per attempt); `metrics` only reads /metrics."""

    admin = "admin"
    project = "project"
    job = "job"
    metrics = "metrics"


@dataclass(frozen=True)
class Principal:
    """A project, and for a job-scoped token the one job it may write."""

    project_id: uuid.UUID
    project_name: str
    job_id: uuid.UUID | None = None
    token_id: uuid.UUID | None = None
    scope: Scope = Scope.project
    cluster_name: str = "default"
    max_priority: int = 100
    expires_at: float | None = None  # seconds since the epoch; checked on every use, cached or not
    attempt: int | None = None  # a job token's attempt (its writes are tied to it: fencing)
    user_name: str | None = None  # the user the token names: usage groups by it

    @property
    def is_job_token(self) -> bool:
        return self.job_id is not None

    @property
    def is_admin(self) -> bool:
        return self.scope is Scope.admin and self.job_id is None
