"""Prometheus metrics for the service: requests by route and status, jobs by status, and the platform
figures that OpenTelemetry exports too (queue depth and GPUs held by project; time queued, admission
latency and job durations as histograms), and usage counters per project (resource-seconds of ended
attempts, from the day rollups), computed from the database at each scrape."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.queues.ranks import QueueRanks
from api.telemetry import repository as telemetry_repository
from api.telemetry.repository import Gauges
from trainmaster.models import JobStatus

BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
HISTOGRAMS = {  # figure → (name, help): the same figures as OpenTelemetry's trainmaster.job.* histograms
    "queued": ("trainmaster_job_queued_seconds", "Time a job waited in the queue until admitted"),
    "admission": ("trainmaster_job_admission_seconds", "Time from admission until the job's workers run"),
    "duration": ("trainmaster_job_duration_seconds", "Duration of finished jobs, by final status"),
}


class ServiceMetrics:
    def __init__(self, ranks: QueueRanks | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "trainmaster_http_requests_total",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "trainmaster_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["route", "method"],
            registry=self.registry,
        )
        self.jobs = Gauge("trainmaster_jobs", "Jobs by status", ["status"], registry=self.registry)
        self.platform = PlatformCollector()
        self.registry.register(self.platform)
        if ranks is not None:
            self.registry.register(RankCacheCollector(ranks))

    def set_job_counts(self, counts: dict[JobStatus, int]) -> None:
        for status in JobStatus:
            self.jobs.labels(status=status.value).set(counts.get(status, 0))


class PlatformSnapshot:
    """The database's figures for /metrics, read at most once per `max_age_s` whatever the scrape rate
    (several Prometheus servers, a short interval, many replicas each scraped): concurrent scrapes of a
    stale snapshot share one read."""

    def __init__(self, metrics: ServiceMetrics, max_age_s: float, clock: Callable[[], float] = time.monotonic):
        self.metrics = metrics
        self.max_age_s = max_age_s
        self.clock = clock
        self.read_at: float | None = None
        self.reads = 0
        self.lock = asyncio.Lock()

    def fresh(self) -> bool:
        return self.read_at is not None and self.clock() - self.read_at < self.max_age_s

    async def refresh(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        if self.fresh():
            return
        async with self.lock:
            if self.fresh():
                return  # another scrape read it while this one waited
            async with sessions() as session:
                figures = await telemetry_repository.snapshot(session, BUCKETS)
            self.reads += 1
            self.metrics.set_job_counts({JobStatus(k): n for k, n in figures.gauges.jobs_by_status.items()})
            self.metrics.platform.update(figures.gauges, figures.histograms, figures.usage)
            self.read_at = self.clock()


class RankCacheCollector(Collector):
    """How the queue-rank cache of this process answered (api/queues/ranks.py): a poll of a queued job it
    knew (hit), did not (miss: counted in PostgreSQL), and the groups it numbered whole (warm)."""

    def __init__(self, ranks: QueueRanks) -> None:
        self.ranks = ranks

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "trainmaster_queue_rank_cache", "Queue-rank cache lookups of this API process", labels=["outcome"]
        )
        for outcome, value in (("hit", self.ranks.hits), ("miss", self.ranks.misses), ("warm", self.ranks.warms)):
            family.add_metric([outcome], value)
        yield family
        yield GaugeMetricFamily("trainmaster_queue_rank_cache_jobs", "Queued jobs it knows", len(self.ranks.group_of))


class PlatformCollector(Collector):
    """Yields the figures of the latest scrape (`update` is called just before rendering)."""

    def __init__(self) -> None:
        self.gauges = Gauges({}, {}, {})
        self.histograms: dict[tuple[str, str, str], tuple[list[int], float]] = {}
        self.usage: dict[str, dict[str, float]] = {}

    def update(
        self,
        gauges: Gauges,
        histograms: dict[tuple[str, str, str], tuple[list[int], float]],
        usage: dict[str, dict[str, float]],
    ) -> None:
        self.gauges, self.histograms, self.usage = gauges, histograms, usage

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily("trainmaster_queue_depth", "Queued jobs by project", labels=["project"])
        gpus = GaugeMetricFamily(
            "trainmaster_gpus_held", "GPUs held by admitted jobs (starting, running, cancelling)", labels=["project"]
        )
        for project, depth in sorted(self.gauges.queue_depth.items()):
            queue.add_metric([project], depth)
        for project, held in sorted(self.gauges.gpus_held.items()):
            gpus.add_metric([project], held)
        yield queue
        yield gpus
        seconds = CounterMetricFamily(
            "trainmaster_usage_resource_seconds",
            "CPU- and GPU-seconds of ended attempts by project and part (starting, productive, lost)",
            labels=["project", "resource", "part"],
        )
        attempts = CounterMetricFamily("trainmaster_usage_attempts", "Ended attempts by project", labels=["project"])
        for project, figures in sorted(self.usage.items()):
            attempts.add_metric([project], figures.get("attempts", 0.0))
            for resource in ("cpu", "gpu"):
                for part in ("starting", "productive", "lost"):
                    seconds.add_metric([project, resource.upper(), part], figures.get(f"{resource}_{part}", 0.0))
        yield seconds
        yield attempts
        for figure, (name, help_text) in HISTOGRAMS.items():
            labels = ["project", "status"] if figure == "duration" else ["project"]
            family = HistogramMetricFamily(name, help_text, labels=labels)
            for (kind, project, status), (counts, total) in sorted(self.histograms.items()):
                if kind != figure:
                    continue
                cumulative, buckets = 0, []
                for bound, count in zip([*map(str, BUCKETS), "+Inf"], counts, strict=True):
                    cumulative += count
                    buckets.append((bound, float(cumulative)))
                family.add_metric([project, status] if figure == "duration" else [project], buckets, total)
            yield family


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_code = 500
        started = time.perf_counter()

        async def recording_send(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = _route_template(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(route=route, method=method, status=str(status_code)).inc()
            self.metrics.latency.labels(route=route, method=method).observe(time.perf_counter() - started)


def _route_template(scope: Scope) -> str:
    """The path template ("/v1/jobs/{job_id}") the router matched, so label cardinality stays bounded."""
    route = scope.get("route")
    return str(getattr(route, "path", "unmatched"))
