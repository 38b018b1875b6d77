"""OpenTelemetry from the real processes: `trainmaster api` and `trainmaster dispatcher` both have
OTEL_EXPORTER_OTLP_ENDPOINT set, a real Ray job runs, and the receiver gets one trace for it (exactly
one: the two processes never both export), with the first step the job's own metrics mark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack, running_stack
from tests.factories.jobs import TERMINAL, small_mlp, wait_for_status
from tests.factories.waiting import wait_until
from tests.ops.otlp_receiver import Received, attributes, otlp_receiver

pytestmark = pytest.mark.ray


@pytest.fixture
def exporting_stack(
    pg_server_url: str, ray_head: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Stack, Received]]:
    with otlp_receiver() as (url, received):
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "TRAINMASTER_TELEMETRY_INTERVAL_S": "0.5",
        }
        for name, value in otel.items():
            monkeypatch.setenv(name, value)  # the API process inherits the test's environment
        with running_stack(pg_server_url, ray_head, tmp_path, extra_env=otel) as stack:
            yield stack, received


def test_a_real_job_leaves_one_trace_from_submit_to_end(exporting_stack: tuple[Stack, Received]) -> None:
    stack, received = exporting_stack
    with stack.client() as client:
        job = client.submit(
            name="traced",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=1),
            config=small_mlp(epochs=1),
            labels={"otel-metrics": "true"},
        )
        done = wait_for_status(client, job.id, TERMINAL)
        assert done.status is tm.JobStatus.succeeded, done.error

    trace_id = bytes.fromhex(job.id.replace("-", ""))

    def spans() -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for resource, span in received.spans():
            if span.trace_id == trace_id:
                found.setdefault(span.name, []).append((resource, span))
        return found

    wait_until(lambda: {"job traced", "training"} <= spans().keys(), 60, what="the job's trace")
    by_name = spans()
    assert len(by_name["job traced"]) == 1  # one exporter, one trace
    resource, root = by_name["job traced"][0]
    assert resource["service.name"] in {"trainmaster-api", "trainmaster-dispatcher"}
    assert attributes(root.attributes)["trainmaster.job.id"] == job.id
    assert [event.name for event in root.events] == ["submit", "admit", "launch", "first step", "end"]
    first_step = next(event for event in root.events if event.name == "first step")
    assert root.start_time_unix_nano < first_step.time_unix_nano <= root.end_time_unix_nano
    wait_until(
        lambda: any(
            attributes(point.attributes).get("trainmaster.job.id") == job.id
            for _, point in received.data_points("trainmaster.job.metric.loss")
        ),
        30,
        what="the job's loss as a metric",
    )
