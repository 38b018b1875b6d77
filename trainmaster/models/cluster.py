"""The Ray cluster as `GET /v1/cluster` reports it: nodes, total and free resources, queue depth."""

from __future__ import annotations

from pydantic import Field

from trainmaster.models.base import ResponseModel


class ClusterNode(ResponseModel):
    node_id: str
    ip: str | None = None
    total: dict[str, float]
    free: dict[str, float]


class ClusterInfo(ResponseModel):
    name: str = "default"  # the cluster's record (a trust domain: its projects' jobs run on it alone)
    reachable: bool
    error: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)
    total: dict[str, float] = Field(default_factory=dict)
    free: dict[str, float] = Field(default_factory=dict)
    queue_depth: int = 0
    project_queue_depth: int = 0


class QueuedJobInfo(ResponseModel):
    id: str
    name: str
    priority: int
    queue_position: int | None = None
    pending_reason: str | None = None


class ProjectQueue(ResponseModel):
    """One project of a cluster as its queue stands: its quota, what its active jobs hold, what of
    that is borrowed from its cohort, what of its own quota others of the cohort use (`lent`), its fair
    share, and its waiting jobs in admission order (the first `limit`; `waiting` counts them all)."""

    project: str
    quota: dict[str, float] = Field(default_factory=dict)
    cohort: str | None = None
    usage: dict[str, float] = Field(default_factory=dict)
    borrowed: dict[str, float] = Field(default_factory=dict)
    lent: dict[str, float] = Field(default_factory=dict)
    waiting: int = 0
    # Its dominant share of the cluster: averaged with a half-life plus what it holds now. Of projects of
    # equal priority, the smaller share is admitted first.
    fair_share: float = 0.0
    jobs: list[QueuedJobInfo] = Field(default_factory=list)


class Queues(ResponseModel):
    cluster: str
    items: list[ProjectQueue]
