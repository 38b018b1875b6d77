"""The MLflow mirror against a real `mlflow server` (its backend store in PostgreSQL), read back with
MLflow's own client: one run per job with its params, its metric history and its final status."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.stack.postgres import create_database, drop_database
from api.telemetry import repository as repo
from api.telemetry.mlflow import JOB_TAG, MlflowMirror
from tests.factories.auth import project_token
from tests.factories.http import post_losses, submit
from tests.factories.processes import stop, wait_answering
from tests.factories.waiting import wait_until
from tests.ops.jobflow import advance, exporting
from trainmaster.models import JobStatus
from trainmaster.ports import free_port

mlflow = pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def mlflow_server(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = create_database(pg_server_url, "tm_mlflow")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port(15000)
    log = (folder / "server.log").open("ab")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--backend-store-uri",
            "postgresql+psycopg://" + store.split("://", 1)[1],
            "--artifacts-destination",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(process, f"{url}/health", folder / "server.log", 120, "mlflow server", interval=0.5)
        yield url
    finally:
        stop(process, 20)
        log.close()
        drop_database(pg_server_url, store)


def test_each_job_is_mirrored_as_one_run_with_params_metrics_and_status(
    database_url: str, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP")]:
        monkeypatch.delenv(name)
    settings = Settings(database_url=database_url, mlflow_tracking_uri=mlflow_server, telemetry_interval_s=0.2)
    token = project_token(database_url, "alpha")
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)

    def run_of(job_id: str):  # type: ignore[no-untyped-def]
        experiment = client.get_experiment_by_name("alpha")
        if experiment is None:
            return None
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{job_id}'")
        return runs[0] if len(runs) == 1 else None

    with TestClient(create_app(settings)) as http:
        # The mirror follows rows newer than when it started leading: wait for that first.
        wait_until(lambda: exporting(database_url), 20, what="the mirror to lead")
        good = submit(http, token, name="mirrored", config={"epochs": 3, "lr": 0.1}, labels={"team": "vision"})
        bad = submit(http, token, name="mirrored-fails")
        for status in (JobStatus.starting, JobStatus.running):
            advance(settings, good, status)
            advance(settings, bad, status)
        post_losses(http, token, good, [0.9, 0.4], first_step=1, attempt=1)
        wait_until(lambda: run_of(good) is not None, 30, what="the job's run")
        advance(settings, good, JobStatus.succeeded)
        advance(settings, bad, JobStatus.failed, error="boom")
        wait_until(lambda: (r := run_of(good)) is not None and r.info.status == "FINISHED", 30, what="FINISHED")
        wait_until(lambda: (r := run_of(bad)) is not None and r.info.status == "FAILED", 30, what="FAILED")

    run = run_of(good)
    assert run.info.run_name == "mirrored"
    assert run.data.params["config.lr"] == "0.1" and run.data.params["config.epochs"] == "3"
    assert run.data.params["scaling.num_workers"] == "2"
    assert run.data.tags["trainmaster.label.team"] == "vision"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(1, 0.9), (2, 0.4)]

    async def found_again() -> str:
        """A restarted mirror finds the job's run by its tag instead of making a second one."""
        mirror = MlflowMirror(mlflow_server, {})
        from api.db.session import create_engine, session_factory

        engine = create_engine(settings)
        try:
            async with session_factory(engine)() as session:
                [timeline] = await repo.timelines(session, [uuid.UUID(good)])
            return await mirror.run_for(timeline)
        finally:
            await mirror.close()
            await engine.dispose()

    assert asyncio.run(found_again()) == run.info.run_id
