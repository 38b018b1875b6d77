"""What a project token reads on /metrics: only the series labelled with its own project.

The platform's figures are labelled by project (queue depth, GPUs held, usage, the job histograms:
api/ops/prometheus.py); the others (HTTP requests, jobs by status, the rank cache) describe the whole
service and every tenant's traffic in it, so a project token sees none of them. Admin and metrics tokens
(only an admin mints those) read everything.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

PROJECT_LABEL = "project"


class ProjectView:
    """A collector over `source` that yields each family with only its samples of `project`, and no
    family that has none."""

    def __init__(self, source: Collector, project: str):
        self.source = source
        self.project = project

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            samples = [s for s in family.samples if s.labels.get(PROJECT_LABEL) == self.project]
            if samples:
                yield _with_samples(family, samples)


def _with_samples(family: Metric, samples: list[Sample]) -> Metric:
    kept = Metric(family.name, family.documentation, family.type, family.unit)
    kept.samples = samples
    return kept
