"""/metrics carries the platform figures OpenTelemetry exports: gauges by project, histograms of time
queued, admission latency and job durations by final status, computed from the database."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.settings import Settings
from tests.factories.auth import project_token, scoped_token
from tests.factories.http import bearer, submit
from tests.ops.jobflow import advance
from trainmaster.models import JobStatus


def scrape(http: TestClient, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = http.get("/metrics", headers=bearer(token))
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_carry_queue_depth_gpus_held_and_the_job_histograms(database_url: str) -> None:
    from api.app import create_app

    settings = Settings(database_url=database_url)
    alpha, beta = project_token(database_url, "alpha"), project_token(database_url, "beta")
    gpus = {"num_workers": 2, "resources_per_worker": {"CPU": 1, "GPU": 1}}
    with TestClient(create_app(settings)) as http:
        running = submit(http, alpha, name="runs", scaling=gpus)
        submit(http, alpha, name="waits")
        ends = submit(http, beta, name="ends")
        for status in (JobStatus.starting, JobStatus.running):
            advance(settings, running, status)
            advance(settings, ends, status)
        advance(settings, ends, JobStatus.failed, error="boom")
        samples = scrape(http, scoped_token(database_url, "ops", "metrics"))

    assert samples[("trainmaster_queue_depth", (("project", "alpha"),))] == 1
    assert samples[("trainmaster_queue_depth", (("project", "beta"),))] == 0
    assert samples[("trainmaster_gpus_held", (("project", "alpha"),))] == 2
    assert samples[("trainmaster_gpus_held", (("project", "beta"),))] == 0
    assert samples[("trainmaster_job_queued_seconds_count", (("project", "alpha"),))] == 1
    assert samples[("trainmaster_job_queued_seconds_count", (("project", "beta"),))] == 1
    assert samples[("trainmaster_job_admission_seconds_count", (("project", "alpha"),))] == 1
    failed = (("project", "beta"), ("status", "failed"))
    assert samples[("trainmaster_job_duration_seconds_count", failed)] == 1
    # Each step took well under a second here: every observation is in the first bucket and all above.
    assert samples[("trainmaster_job_duration_seconds_bucket", (("le", "1.0"), *failed))] == 1
    assert samples[("trainmaster_job_duration_seconds_bucket", (("le", "+Inf"), *failed))] == 1
    assert ("trainmaster_job_duration_seconds_count", (("project", "alpha"), ("status", "failed"))) not in samples
    assert samples[("trainmaster_jobs", (("status", "running"),))] == 1


def test_the_grafana_dashboard_queries_only_metrics_the_api_serves(database_url: str) -> None:
    import json
    import re
    from pathlib import Path

    from api.app import create_app

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "platform/grafana/trainmaster.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\btrainmaster_[a-z_]+", target["expr"])
    }
    settings = Settings(database_url=database_url)
    token = project_token(database_url, "alpha")
    with TestClient(create_app(settings)) as http:
        job = submit(http, token)
        for status in (JobStatus.starting, JobStatus.running, JobStatus.succeeded):
            advance(settings, job, status)
        served = {name for name, _ in scrape(http, scoped_token(database_url, "ops", "admin"))}
    assert len(queried) >= 7
    assert queried <= served, queried - served
