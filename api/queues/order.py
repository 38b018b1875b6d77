"""The admission order in Python: the key `decide` sorts by and the batch the simulator builds.

The same order in SQL is `api/queues/sql.py` (the `tm_share` function, the claim and the positions); a
test holds the two equal on random queues (tests/integration/test_scale.py). Change one, change
the other in the same commit.

The order: priority (highest first), then the job's progressive share (lowest first), then age. A job's
share is its project's dominant share (`dominant_share`) with the gangs of its project's queued jobs
ahead of it (higher priority, then older) added to what the project holds: DRF's progressive filling.
Along one project's own order that share only grows, so a project's jobs keep their (priority, age)
order, and the first N jobs of the whole queue are among the first N of each project."""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

RESOURCES = ("CPU", "GPU")


class Running(Protocol):
    """What the order and preemption's rules read of a job (an ORM `Job` row satisfies it)."""

    @property
    def project_id(self) -> uuid.UUID: ...
    @property
    def priority(self) -> int: ...
    @property
    def gang_cpus(self) -> float: ...
    @property
    def gang_gpus(self) -> float: ...


class Queued(Running, Protocol):
    """What admission reads of a queued job (repository.QueuedJob; bench/simulate.py's own jobs)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def spec(self) -> Mapping[str, Any]: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def share(self) -> float: ...
    @property
    def infeasible_since(self) -> datetime | None: ...
    @property
    def bypassed_since(self) -> datetime | None: ...


Job = TypeVar("Job", bound=Queued)


def gang(job: Running) -> dict[str, float]:
    """The CPUs and GPUs a job's gang holds once admitted."""
    return {"CPU": job.gang_cpus, "GPU": job.gang_gpus}


def admission_key(job: Queued) -> tuple[int, float, datetime, uuid.UUID]:
    """Admission order: priority (highest first), then the job's progressive share, then submission
    order. sql.CLAIM's ORDER BY and sql.position are the same key in SQL."""
    return (-job.priority, job.share, job.created_at, job.id)


def dominant_share(history: Mapping[str, float], held: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """A project's fair share (dominant-resource fairness): over CPU and GPU, the largest of its decayed
    history plus what it holds as a fraction of the cluster's capacity (`tm_share` in sql.py)."""
    return max(
        history.get(r, 0.0) + (held.get(r, 0.0) / capacity[r] if capacity.get(r, 0.0) > 0 else 0.0) for r in RESOURCES
    )


def progressive_batch(
    projects: Iterable[Iterator[Job]], with_share: Callable[[Job, Mapping[str, float]], Job], limit: int
) -> list[Job]:
    """The first `limit` jobs of the queue in admission order, as sql.CLAIM takes them: `projects` gives
    each project's queued jobs in its own (priority, age) order, and `with_share(job, ahead)` returns the
    job carrying its share with `ahead` (the gangs of its project before it) added to what the project
    holds. Merged from the projects' heads: a project's next job is read only once its previous one is
    in the batch, as the claim's per-project index scans stop."""
    frontier: list[tuple[tuple[int, float, datetime, uuid.UUID], Job, Iterator[Job], dict[str, float]]] = []
    for pending in projects:
        ahead = dict.fromkeys(RESOURCES, 0.0)
        if (job := next(pending, None)) is not None:
            job = with_share(job, ahead)
            frontier.append((admission_key(job), job, pending, ahead))
    heapq.heapify(frontier)
    batch: list[Job] = []
    while frontier and len(batch) < limit:
        _, job, pending, ahead = heapq.heappop(frontier)
        batch.append(job)
        if (following := next(pending, None)) is not None:
            for resource, amount in gang(job).items():
                ahead[resource] += amount
            following = with_share(following, ahead)
            heapq.heappush(frontier, (admission_key(following), following, pending, ahead))
    return batch
