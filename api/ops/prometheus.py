"""Prometheus metrics for the service: requests by route and status, jobs by status."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainmaster.models import JobStatus


class ServiceMetrics:
    def __init__(self) -> None:
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

    def set_job_counts(self, counts: dict[JobStatus, int]) -> None:
        for status in JobStatus:
            self.jobs.labels(status=status.value).set(counts.get(status, 0))


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
