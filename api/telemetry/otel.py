"""OpenTelemetry export over OTLP/HTTP: platform metrics, chosen jobs' training metrics, a trace per job.

On only when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or a per-signal `..._METRICS_ENDPOINT` /
`..._TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is not true. Everything else is the SDK's own
reading of the standard variables: `OTEL_EXPORTER_OTLP_HEADERS` (e.g. an API key), `..._TIMEOUT`,
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_BSP_*`,
`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`. The providers are this module's own, never the
global ones, so nothing else in the process (Ray) exports through them by accident.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions
from opentelemetry.metrics import Observation as Reading
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from api.telemetry.repository import Gauges, JobTimeline, Observation

log = logging.getLogger("trainmaster.telemetry")

JOB_METRICS_LABEL = ("otel-metrics", "true")  # a job with this label has its training metrics exported
HISTOGRAMS = {
    "queued": ("trainmaster.job.queued.duration", "Time a job waited in the queue until admitted"),
    "admission": ("trainmaster.job.admission.duration", "Time from admission until the job's workers run"),
    "duration": ("trainmaster.job.duration", "Duration of finished jobs, by final status"),
}
# Explicit bounds shared with Prometheus (seconds): jobs wait and run from seconds to days.
BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class OtelExport:
    """The process's meter and tracer, and the instruments every figure is recorded through."""

    def __init__(self, service_name: str, gauges: Callable[[], Gauges | None]):
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        if protocol != "http/protobuf":
            log.warning("otlp_protocol_ignored", extra={"protocol": protocol, "exported_as": "http/protobuf"})
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default service name.
        resource = Resource({"service.name": service_name, "service.namespace": "trainmaster"}).merge(
            OTELResourceDetector().detect()
        )
        if os.environ.get("OTEL_SERVICE_NAME"):
            resource = resource.merge(Resource({"service.name": os.environ["OTEL_SERVICE_NAME"]}))
        views = [
            View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(BUCKETS))
            for name, _ in HISTOGRAMS.values()
        ]
        self.reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self.reader], views=views)
        self.tracer_provider = TracerProvider(resource=resource, id_generator=_JobTraceIds())
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.tracer_provider.get_tracer("trainmaster")
        meter = self.meter_provider.get_meter("trainmaster")
        self.meter = meter

        def reading(
            attribute: str, pick: Callable[[Gauges], Mapping[str, float]]
        ) -> Callable[[CallbackOptions], Iterable[Reading]]:
            def callback(_: CallbackOptions) -> Iterable[Reading]:
                current = gauges()
                if current is None:  # not the exporting process (see TelemetryService)
                    return []
                return [Reading(value, {attribute: key}) for key, value in pick(current).items()]

            return callback

        meter.create_observable_gauge(
            "trainmaster.queue.depth",
            [reading("project", lambda g: g.queue_depth)],
            unit="{job}",
            description="Queued jobs by project",
        )
        meter.create_observable_gauge(
            "trainmaster.gpus.held",
            [reading("project", lambda g: g.gpus_held)],
            unit="{gpu}",
            description="GPUs held by admitted jobs (starting, running, cancelling) by project",
        )
        meter.create_observable_gauge(
            "trainmaster.jobs",
            [reading("status", lambda g: g.jobs_by_status)],
            unit="{job}",
            description="Jobs by status",
        )
        self.histograms = {
            figure: meter.create_histogram(name, unit="s", description=description)
            for figure, (name, description) in HISTOGRAMS.items()
        }
        self.job_gauges: dict[str, Any] = {}

    def observe(self, observation: Observation) -> None:
        attributes = {"project": observation.project}
        if observation.figure == "duration":
            attributes["status"] = observation.status
        self.histograms[observation.figure].record(observation.seconds, attributes)

    def job_metric(self, name: str, value: float, attributes: dict[str, str | int]) -> None:
        """A training metric of a job that asked for export, as gauge `trainmaster.job.metric.<name>`."""
        instrument = "trainmaster.job.metric." + re.sub(r"[^A-Za-z0-9_.\-/]", "_", name)[:200]
        gauge = self.job_gauges.get(instrument)
        if gauge is None:
            gauge = self.job_gauges[instrument] = self.meter.create_gauge(
                instrument, description=f"training metric {name!r}"
            )
        gauge.set(value, attributes)

    def trace(self, job: JobTimeline) -> None:
        """The job's whole life as one trace, written when it ends, from the database's timestamps.

        The trace id is the job id (a UUID is 128 bits, like a trace id), so a trace is found by job id."""
        _JobTraceIds.current = job.id
        try:
            end = job.finished_at or job.created_at
            root = self.tracer.start_span(
                f"job {job.name}",
                start_time=_ns(job.created_at),
                attributes={
                    "trainmaster.job.id": str(job.id),
                    "trainmaster.job.name": job.name,
                    "trainmaster.project": job.project,
                    "trainmaster.job.status": job.status,
                    "trainmaster.job.attempts": len(job.attempts),
                    "trainmaster.job.num_workers": _workers(job.spec.get("scaling", {}).get("num_workers", 0)),
                },
            )
            root.add_event("submit", timestamp=_ns(job.created_at))
            context = set_span_in_context(root)
            admitted = job.admitted_at
            if admitted is not None:
                self._span("queued", job.created_at, admitted, context, {"trainmaster.job.id": str(job.id)})
                root.add_event("admit", timestamp=_ns(admitted))
            for attempt in job.attempts:
                attempt_end = attempt.finished_at or end
                span = self.tracer.start_span(
                    f"attempt {attempt.n}",
                    context=context,
                    start_time=_ns(attempt.created_at),
                    attributes={
                        "trainmaster.job.id": str(job.id),
                        "trainmaster.attempt": attempt.n,
                        "trainmaster.attempt.status": attempt.status,
                        "ray.submission_id": attempt.ray_submission_id,
                    },
                )
                inner = set_span_in_context(span)
                attrs = {"trainmaster.job.id": str(job.id), "trainmaster.attempt": attempt.n}
                launched = attempt.started_at or attempt_end
                self._span("launch", attempt.created_at, launched, inner, attrs)
                root.add_event("launch", timestamp=_ns(attempt.created_at), attributes={"attempt": attempt.n})
                if attempt.first_step_at is not None:
                    span.add_event("first step", timestamp=_ns(attempt.first_step_at))
                    root.add_event(
                        "first step", timestamp=_ns(attempt.first_step_at), attributes={"attempt": attempt.n}
                    )
                    self._span("training", attempt.first_step_at, attempt_end, inner, attrs)
                if attempt.error:
                    span.set_status(Status(StatusCode.ERROR, attempt.error[:1000]))
                span.end(end_time=_ns(max(attempt_end, attempt.created_at)))
            root.add_event("end", timestamp=_ns(end), attributes={"status": job.status})
            if job.status != "succeeded":
                root.set_status(Status(StatusCode.ERROR, (job.error or job.status)[:1000]))
            root.end(end_time=_ns(end))
        finally:
            _JobTraceIds.current = None

    def _span(self, name: str, start: datetime, end: datetime, context: Any, attributes: dict[str, Any]) -> None:
        span = self.tracer.start_span(name, context=context, start_time=_ns(start), attributes=attributes)
        span.end(end_time=_ns(max(start, end)))

    def flush(self) -> None:
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


class _JobTraceIds(RandomIdGenerator):
    """Random span ids; the trace id is the job id while a job's trace is written."""

    current: uuid.UUID | None = None

    def generate_trace_id(self) -> int:
        if _JobTraceIds.current is not None:
            return _JobTraceIds.current.int
        return super().generate_trace_id()


def _workers(size: Any) -> int:
    """The gang's size; an elastic gang's ({min, max}) maximum."""
    return int(size.get("max", 0)) if isinstance(size, dict) else int(size)
