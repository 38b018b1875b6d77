"""OpenTelemetry export, received by a real OTLP/HTTP receiver that decodes with `opentelemetry-proto`.

The API runs in process with OTEL_* set (its lifespan starts the export); jobs move through their life
as the dispatcher moves them (tests/ops/jobflow.py) and report metrics through the real ingest route.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.telemetry.service import Telemetry, otel_enabled
from tests.factories.auth import project_token
from tests.factories.http import post_losses, submit
from tests.factories.waiting import wait_until
from tests.ops.jobflow import advance, exporting
from tests.ops.otlp_receiver import Received, otlp_receiver
from trainmaster.models import JobStatus


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Received]:
    with otlp_receiver() as (url, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")  # ms: the SDK reads these itself
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ops-test")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret-1")
        yield received


def latest(received: Received, name: str, **attrs: Any) -> Any:
    """The newest data point of `name` whose attributes include `attrs`, or None."""
    from tests.ops.otlp_receiver import attributes

    points = [p for _, p in received.data_points(name) if attrs.items() <= attributes(p.attributes).items()]
    return points[-1] if points else None


def test_platform_metrics_training_metrics_and_a_trace_per_job(database_url: str, receiver: Received) -> None:
    settings = Settings(database_url=database_url, telemetry_interval_s=0.2)
    token = project_token(database_url, "alpha")
    gpu_scaling = {"num_workers": 2, "resources_per_worker": {"CPU": 1, "GPU": 1}}
    with TestClient(create_app(settings)) as http:
        # The export follows rows newer than when it started leading: wait for that first.
        wait_until(lambda: exporting(database_url), 20, what="the export to lead")
        watched = submit(http, token, name="watched", scaling=gpu_scaling, labels={"otel-metrics": "true"})
        quiet = submit(http, token, name="quiet")
        wait_until(
            lambda: getattr(latest(receiver, "trainmaster.queue.depth", project="alpha"), "as_int", 0) == 2,
            20,
            what="queue depth 2",
        )
        for status in (JobStatus.starting, JobStatus.running):
            advance(settings, watched, status)
            advance(settings, quiet, status)
        post_losses(http, token, watched, [0.9, 0.5], first_step=1, attempt=1)
        post_losses(http, token, quiet, [0.8], first_step=1, attempt=1)
        wait_until(
            lambda: getattr(latest(receiver, "trainmaster.gpus.held", project="alpha"), "as_double", 0) == 2.0,
            20,
            what="2 GPUs held",
        )
        advance(settings, watched, JobStatus.succeeded)
        advance(settings, quiet, JobStatus.failed, error="boom")

        def trace_of(job_id: str) -> list[Any]:
            trace_id = uuid.UUID(job_id).bytes
            return [span for _, span in receiver.spans() if span.trace_id == trace_id]

        wait_until(lambda: len(trace_of(watched)) >= 5 and trace_of(quiet), 30, what="both jobs' traces")
        wait_until(
            lambda: latest(receiver, "trainmaster.job.duration", project="alpha", status="failed") is not None,
            20,
            what="the duration histogram",
        )

    # A trace per job, its id the job id: submit → admit (queued) → launch → first step (training) → end.
    from tests.ops.otlp_receiver import attributes

    spans = {span.name: span for span in trace_of(watched)}
    assert {"job watched", "queued", "attempt 1", "launch", "training"} <= spans.keys()
    root = spans["job watched"]
    assert attributes(root.attributes)["trainmaster.job.id"] == watched
    assert [event.name for event in root.events] == ["submit", "admit", "launch", "first step", "end"]
    assert root.status.code == 0  # unset: it succeeded
    root_id = root.span_id
    assert spans["queued"].parent_span_id == root_id and spans["attempt 1"].parent_span_id == root_id
    assert spans["launch"].parent_span_id == spans["attempt 1"].span_id
    assert spans["queued"].end_time_unix_nano <= spans["launch"].start_time_unix_nano + 1_000_000
    quiet_root = next(span for span in trace_of(quiet) if span.name == "job quiet")
    assert quiet_root.status.code == 2 and "boom" in quiet_root.status.message  # ERROR, with the reason

    # Platform figures as histograms: time queued, admission latency, durations by final status.
    for name, attrs in (
        ("trainmaster.job.queued.duration", {"project": "alpha"}),
        ("trainmaster.job.admission.duration", {"project": "alpha"}),
        ("trainmaster.job.duration", {"project": "alpha", "status": "succeeded"}),
    ):
        point = latest(receiver, name, **attrs)
        assert point is not None and point.count >= 1, name
        assert list(point.explicit_bounds)[:3] == [1.0, 5.0, 15.0]

    # Training metrics only for the job that asked (label otel-metrics=true).
    loss = latest(receiver, "trainmaster.job.metric.loss", **{"trainmaster.job.id": watched})
    assert loss is not None and loss.as_double == 0.5
    assert latest(receiver, "trainmaster.job.metric.loss", **{"trainmaster.job.id": quiet}) is None

    # The standard variables reached the SDK: resource attributes, headers, service name.
    resource, _ = receiver.spans()[0]
    assert resource["service.name"] == "trainmaster-api"
    assert resource["deployment.environment"] == "ops-test"
    assert all(headers.get("x-api-key") == "secret-1" for headers in receiver.headers)


def test_export_is_off_without_an_endpoint_and_with_the_sdk_disabled() -> None:
    assert not otel_enabled({})
    assert otel_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert otel_enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not otel_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"})
    assert not Telemetry(Settings(), "trainmaster-api", environ={}).active


def test_one_process_exports_at_a_time_and_another_takes_over(database_url: str, receiver: Received) -> None:
    settings = Settings(database_url=database_url)

    async def scenario() -> tuple[bool, bool, bool]:
        first = Telemetry(settings, "a").start()
        second = Telemetry(settings, "b").start()
        first.task.cancel() if first.task else None  # drive the rounds by hand
        second.task.cancel() if second.task else None
        try:
            first_leads = await first.lead()
            second_waits = not await second.lead()
            assert first.lock_connection is not None
            await first.lock_connection.close()  # the exporting process died
            # The server frees the lock when the dead session's backend exits, a moment after the
            # socket closes: the survivor takes over on one of its next rounds, not necessarily the first.
            deadline = asyncio.get_running_loop().time() + 15
            second_takes_over = await second.lead()
            while not second_takes_over and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                second_takes_over = await second.lead()
            return first_leads, second_waits, second_takes_over
        finally:
            await first.stop()
            await second.stop()

    assert asyncio.run(scenario()) == (True, True, True)
