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
    reachable: bool
    error: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)
    total: dict[str, float] = Field(default_factory=dict)
    free: dict[str, float] = Field(default_factory=dict)
    queue_depth: int = 0
    project_queue_depth: int = 0
