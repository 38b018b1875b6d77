"""Queued jobs as admission's pure rules read them (api/queues/order.py, Queued), without a database."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class QueuedGang:
    project_id: uuid.UUID
    spec: dict[str, Any]
    gang_cpus: float
    gang_gpus: float
    priority: int = 0
    share: float = 0.0
    created_at: datetime = NOW
    infeasible_since: datetime | None = None
    bypassed_since: datetime | None = None
    id: uuid.UUID = field(default_factory=uuid.uuid4)


def queued_gang(project: uuid.UUID, workers: int, gpus: float = 1, **extra: Any) -> QueuedGang:
    """A gang of `workers` x (1 CPU, `gpus` GPU); `extra` goes to the job (priority, share, ...) or, for
    `topology` and `code`, to its spec."""
    scaling: dict[str, Any] = {"num_workers": workers, "resources_per_worker": {"CPU": 1, "GPU": gpus}}
    if "topology" in extra:
        scaling["topology"] = extra.pop("topology")
    spec: dict[str, Any] = {"scaling": scaling}
    if "code" in extra:
        spec["code"] = extra.pop("code")
    return QueuedGang(project, spec, float(workers), workers * gpus, **extra)
