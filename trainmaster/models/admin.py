"""Clusters, projects and tokens: what an admin manages (`/v1/clusters`, `/v1/projects`, `/v1/tokens`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from trainmaster.models.base import LabelKey, LabelValue, RequestModel, ResponseModel, StoredRequestModel, WholeNumber

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", min_length=1, max_length=64)]
ProjectName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", min_length=1, max_length=128)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
Priority = Annotated[WholeNumber, Field(ge=-100, le=100)]
TokenScope = Literal["admin", "project", "metrics"]


class ClusterSpec(StoredRequestModel):
    """A Ray cluster: its Jobs API address, and where the dispatcher reads its Ray token from (a file on
    the dispatcher's host or an environment variable of it; never the token itself)."""

    name: Name
    address: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    token_file: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    token_env: EnvName | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)


class Cluster(ResponseModel):
    name: str
    address: str
    token_file: str | None = None
    token_env: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: datetime


class ClusterList(ResponseModel):
    items: list[Cluster]


# Quotas are kept for the resources every gang's size is counted in (CPU, GPU): a quota of another
# resource is refused (422) rather than stored and not enforced.
QuotaResource = Literal["CPU", "GPU"]
Amount = Annotated[float, Field(ge=0, le=1e9)]
Quota = dict[QuotaResource, Amount]
# Days after a job finished that its unpinned checkpoints are deleted (0: at the collector's next pass).
RetentionDays = Annotated[float, Field(ge=0, le=36500)]
# Bytes of live checkpoints and code packages a project may store (up to an exbibyte).
StorageBytes = Annotated[int, Field(ge=0, le=2**60)]


class ProjectSpec(StoredRequestModel):
    """A project. `quota`: the nominal amount of each resource its active jobs may hold (a resource
    left out is not limited). Projects in one `cohort` lend each other the quota they leave unused:
    a project borrows at most `borrowing_limit` beyond its quota and lends at most `lending_limit`
    of it (left out: no limit)."""

    name: ProjectName
    cluster: Name = "default"
    max_priority: Priority = 100
    quota: Quota = Field(default_factory=dict)
    cohort: Name | None = None
    borrowing_limit: Quota | None = None
    lending_limit: Quota | None = None
    checkpoint_retention_days: RetentionDays | None = None
    storage_quota_bytes: StorageBytes | None = None  # live checkpoints + code packages; None: unlimited


class ProjectPatch(StoredRequestModel):
    """The fields to change; those left out stay. `quota` replaces the whole quota (`{}` lifts it);
    `cohort`, `borrowing_limit`, `lending_limit`, `checkpoint_retention_days` and
    `storage_quota_bytes` given as null are cleared."""

    cluster: Name | None = None
    max_priority: Priority | None = None
    quota: Quota | None = None
    cohort: Name | None = None
    borrowing_limit: Quota | None = None
    lending_limit: Quota | None = None
    checkpoint_retention_days: RetentionDays | None = None
    storage_quota_bytes: StorageBytes | None = None


class Project(ResponseModel):
    name: str
    cluster: str
    max_priority: int
    created_at: datetime
    quota: dict[str, float] = Field(default_factory=dict)
    cohort: str | None = None
    borrowing_limit: dict[str, float] | None = None
    lending_limit: dict[str, float] | None = None
    usage: dict[str, float] = Field(default_factory=dict)  # what its active jobs hold now
    checkpoint_retention_days: float | None = None  # a finished job's unpinned checkpoints, then deleted
    storage_quota_bytes: int | None = None


class ProjectList(ResponseModel):
    items: list[Project]


class ProjectStorage(ResponseModel):
    """What a project stores: its live checkpoints (as their jobs measured them when reported) and
    its code packages, against its `quota_bytes` (None: unlimited)."""

    project: str
    used_bytes: int
    checkpoint_bytes: int
    checkpoints: int
    code_bytes: int
    quota_bytes: int | None = None


class StorageList(ResponseModel):
    items: list[ProjectStorage]


class TokenSpec(StoredRequestModel):
    """A new token. `project`: the caller's own when left out. `expires_in_s`: its life; left out, a
    project token lives 90 days and admin and metrics tokens until revoked; `expires: false` never."""

    project: ProjectName | None = None
    scope: TokenScope = "project"
    description: Annotated[str, StringConstraints(max_length=256)] | None = None
    user: Annotated[str, StringConstraints(max_length=128)] | None = None
    expires_in_s: Annotated[float, Field(gt=0, le=10 * 365 * 86400)] | None = None
    expires: bool = True


class TokenInfo(ResponseModel):
    id: str
    project: str
    scope: str
    description: str | None = None
    user: str | None = None
    job_id: str | None = None
    created_at: datetime
    expires_at: datetime | None = None
    last_used_at: datetime | None = None


class TokenCreated(TokenInfo):
    token: str  # the secret: shown only in this answer


class TokenList(ResponseModel):
    items: list[TokenInfo]


class JobTokenClaim(RequestModel):
    """A job's single-use claim (in its launch's Ray job metadata), exchanged once by its driver."""

    job_id: Annotated[str, StringConstraints(min_length=36, max_length=36)]
    claim: Annotated[str, StringConstraints(min_length=1, max_length=128)]


class JobTokenClaimed(ResponseModel):
    token: str  # the job token: in this answer only
