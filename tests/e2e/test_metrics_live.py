"""Live metrics from a real job: over SSE while it runs, and none lost when the API restarts."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack, start_api
from tests.factories.jobs import TERMINAL, small_mlp, wait_for_status
from tests.factories.waiting import wait_until

pytestmark = pytest.mark.ray


def test_metrics_arrive_over_sse_before_the_job_ends(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="live",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=2),
            config=small_mlp(epochs=6, epoch_sleep_s=1),
        )
        # The first training point; the worker's system samples run on their own 5 s clock from the worker's
        # start, so on a loaded machine one can come before the first step's.
        first = next(v for v in client.stream_metrics(job.id) if not v.name.startswith("sys/"))
        status_when_first_seen = client.get(job.id).status
        assert status_when_first_seen is tm.JobStatus.running
        assert first.name in {"loss", "epoch"} and first.step is not None
        values = list(client.stream_metrics(job.id))  # from the start again, to the end event
        done = wait_for_status(client, job.id, TERMINAL)
        assert done.status is tm.JobStatus.succeeded
        losses = [v for v in values if v.name == "loss"]
        assert {v.rank for v in losses} == {0, 1}
        assert len({v.seq for v in values}) == len(values)
        assert done.latest_metrics and "loss" in done.latest_metrics

    # What every job on the cluster can read of this one through Ray's Jobs API holds no job token,
    # only the claim the driver exchanged (in its metadata, off every command line), worthless now.
    from ray.job_submission import JobSubmissionClient

    seen = JobSubmissionClient(stack.ray.dashboard, headers=stack.ray.headers()).get_job_info(f"tm-{job.id}-1")
    env = (seen.runtime_env or {}).get("env_vars", {})
    claim = (seen.metadata or {}).get("trainmaster_claim", "")
    assert "TRAINMASTER_JOB_TOKEN" not in env and claim.startswith("tm_") and claim not in json.dumps(env)
    replay = httpx.post(f"{stack.api.url}/v1/tokens/claim", json={"job_id": job.id, "claim": claim}, timeout=30)
    assert replay.status_code == 401

    # The dispatcher's final read of a finished job's log, from the real Ray: the whole log, streamed
    # from the driver's node, as the Jobs API's one string has it (lines this short are never cut).
    from api.dispatcher.ray_jobs import RayJobsBackend

    token = stack.ray.token_path.read_text().strip()
    whole = JobSubmissionClient(stack.ray.dashboard, headers=stack.ray.headers()).get_job_logs(f"tm-{job.id}-1")
    assert whole and RayJobsBackend(stack.ray.dashboard, token=token).logs(f"tm-{job.id}-1", 0, final=True) == whole


def test_api_killed_and_restarted_mid_job_loses_no_point(stack: Stack) -> None:
    epochs, steps_per_epoch, workers = 8, 4, 2  # 512 samples / 2 workers / batch 64
    with stack.client() as client:
        job = client.submit(
            name="api-restart",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=workers),
            config=small_mlp(epochs=epochs, samples=512, batch_size=64, epoch_sleep_s=1),
        )
        wait_until(lambda: client.metrics(job.id, names=["loss"]), 180, what="the first points")
        port = int(stack.api.url.rsplit(":", 1)[1])
        stack.api.process.send_signal(signal.SIGKILL)
        stack.api.process.wait()
        with pytest.raises(tm.ConnectionFailed):
            client.get(job.id)
        # Restarting takes the API a few seconds; meanwhile the senders buffer and retry.
        keep = ("TRAINMASTER_RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "TRAINMASTER_SECRETS_PATH")
        same_ray = {k: stack.api.env[k] for k in keep}  # the session stack's API, as it was started
        restarted = start_api(stack.api.env["TRAINMASTER_DATABASE_URL"], stack.api.log_path, same_ray, port=port)
        stack.api.process = restarted.process
        done = wait_for_status(client, job.id, TERMINAL, timeout=300)
        assert done.status is tm.JobStatus.succeeded, done.error
        losses = client.metrics(job.id, names=["loss"])
        assert len(losses) == epochs * steps_per_epoch * workers
        assert len({(v.rank, v.step) for v in losses}) == len(losses)  # and no duplicate
