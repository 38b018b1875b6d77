"""What an elastic gang is counted at: the size quotas, fair share, admission's book and usage charge.

An elastic gang is admitted at its minimum; then its controller reports each resize (`resized`
events, workers/callbacks.py). That report comes from the job's own code, so it is hostile: a size
outside the {min, max} the gang was admitted at, or not a whole number, is refused (422 naming
`data.to`) and nothing of it is counted or recorded. Within the range a job could still report
fewer workers than it holds, to pay for less: the dispatcher reads the gang's placement group from
Ray each round (one bundle per Ray Train worker) and raises the count to what Ray shows
(`at_least_what_ray_shows`), never lowers it (a group being replaced shows less for a moment; an
over-count costs only the job itself).
"""

from __future__ import annotations

from typing import Any

from api.db.models import Job
from api.errors import ValidationError
from trainmaster.models import Scaling


def elastic_scaling(job: Job) -> Scaling | None:
    """The job's gang when it is elastic (its spec was validated when submitted)."""
    return elastic_of(job.spec)


def elastic_of(spec: dict[str, Any]) -> Scaling | None:
    """A stored spec's gang when it is elastic: only its `scaling` is read."""
    scaling = Scaling.model_validate(spec.get("scaling", {}))
    return scaling if scaling.elastic else None


def checked(scaling: Scaling, workers: object) -> int:
    """A reported size: a whole number within the gang's {min, max}, else 422 naming the field."""
    if type(workers) is not int or not scaling.min_workers <= workers <= scaling.max_workers:
        raise ValidationError.field(
            ["body", "data", "to"],
            f"an elastic gang's size: a whole number from {scaling.min_workers} to {scaling.max_workers} "
            f"(the gang's min_workers and max_workers), not {str(workers)[:40]!r}",
        )
    return workers


def counted(job: Job, scaling: Scaling) -> int:
    """The size the job holds now, from what it holds (its gang's CPUs, else GPUs)."""
    per = scaling.worker_resources()
    resource = "CPU" if per.get("CPU", 0.0) > 0 else "GPU"
    held = job.gang_cpus if resource == "CPU" else job.gang_gpus
    return round(held / per[resource]) if per.get(resource, 0.0) > 0 else scaling.min_workers


def hold(job: Job, scaling: Scaling, workers: int) -> None:
    per_worker = scaling.worker_resources()
    job.gang_cpus = per_worker.get("CPU", 0.0) * workers
    job.gang_gpus = per_worker.get("GPU", 0.0) * workers


def at_least_what_ray_shows(job: Job, ray_workers: int) -> tuple[int, int] | None:
    """Raise an elastic gang's count to the workers Ray's placement group holds for it (within its
    max): (the count before, the count now) when it changed, else None."""
    scaling = elastic_scaling(job)
    if scaling is None:
        return None
    before, shown = counted(job, scaling), min(ray_workers, scaling.max_workers)
    if shown <= before:
        return None
    hold(job, scaling, shown)
    return before, shown
