"""The job's environment is written in one place (the dispatcher's launch) and read in one place."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.db.models import Job
from api.dispatcher import launch
from api.settings import Settings
from trainmaster.context import ClaimRefused, JobContext
from trainmaster.models import JobSpec

PROJECT = uuid.uuid4()


def launched_env(settings: Settings, spec: JobSpec) -> dict[str, str]:
    """The driver's environment as Ray's job supervisor makes it of the launch: the runtime_env's
    variables, and the runtime_env and metadata as JSON (RAY_JOB_CONFIG_JSON_ENV_VAR)."""
    job = Job(id=uuid.uuid4(), project_id=PROJECT, name=spec.name, spec=spec.model_dump(mode="json"))
    built = launch.build(settings, job, spec, 3, "tm_job_claim")
    env = built.runtime_env["env_vars"]
    assert isinstance(env, dict)
    config = {"runtime_env": built.runtime_env, "metadata": built.metadata}
    return {**env, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(config)}


def test_what_the_dispatcher_writes_is_what_a_worker_reads() -> None:
    settings = Settings(
        api_url="http://api:8000",
        storage_path="/mnt/ckpt",
        collective_timeout_s=90,
        system_metrics_interval_s=0.5,
    )
    spec = JobSpec(name="ctx", entrypoint="builtin:mlp", env={"NCCL_SOCKET_IFNAME": "eth0"})
    env = launched_env(settings, spec)
    context = JobContext.from_env(env)
    assert context is not None
    assert context.attempt == 3
    assert context.api_url == "http://api:8000"
    # The launch carries the claim, never a token: every job on the cluster can read it (Ray's Jobs API).
    assert context.claim == "tm_job_claim" and context.token is None and "TRAINMASTER_JOB_TOKEN" not in env
    # In its metadata, never its runtime_env: Ray writes that into its workers' command lines.
    assert not [name for name, value in env.items() if "tm_job_claim" in value and name.startswith("TRAINMASTER")]
    assert context.storage_path == f"/mnt/ckpt/{PROJECT}"  # its project's folder: runs never share a tree
    assert context.collective_timeout_s == 90
    assert context.system_metrics_interval_s == 0.5  # the documented setting reaches the workers
    assert JobSpec.model_validate_json(context.spec_json or "") == spec
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_a_jobs_env_cannot_impersonate_another_job_but_may_set_its_collective_timeout() -> None:
    spec = JobSpec(
        name="ctx",
        entrypoint="builtin:mlp",
        env={
            "TRAINMASTER_JOB_ID": "someone-else",
            "TRAINMASTER_COLLECTIVE_TIMEOUT_S": "12",
            "TRAINMASTER_JOB_TOKEN": "tm_forged",
            "TRAINMASTER_JOB_CLAIM": "tm_forged",
        },
    )
    context = JobContext.from_env(launched_env(Settings(), spec))
    assert context is not None
    assert context.job_id != "someone-else"
    assert context.token is None and context.claim == "tm_job_claim"
    assert context.collective_timeout_s == 12


def test_outside_a_job_there_is_no_context() -> None:
    assert JobContext.from_env({"TRAINMASTER_API_URL": "http://api"}) is None


def test_an_admission_round_launches_from_the_stored_spec_what_the_model_would_launch() -> None:
    """Admission builds launches from the spec as the jobs table holds it (LaunchSpec.stored), not
    from a validated JobSpec: the driver reads back the same spec and every other part is equal."""
    spec = JobSpec(name="ctx", entrypoint="builtin:mlp", env={"NCCL_SOCKET_IFNAME": "eth0"}, pip=["einops==0.8.0"])
    job = Job(id=uuid.uuid4(), project_id=PROJECT, name=spec.name, spec=spec.model_dump(mode="json"))
    settings = Settings(storage_path="/mnt/ckpt")
    from_model = launch.build(settings, job, spec, 2, "tm_job_token")
    from_row = launch.build(settings, job, launch.LaunchSpec.stored(job.spec), 2, "tm_job_token")
    model_env, row_env = (dict(b.runtime_env["env_vars"]) for b in (from_model, from_row))
    assert JobSpec.model_validate_json(row_env.pop("TRAINMASTER_JOB_SPEC")) == spec
    model_env.pop("TRAINMASTER_JOB_SPEC")
    assert row_env == model_env and row_env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert from_row.runtime_env["pip"] == ["einops==0.8.0"]
    assert (from_row.submission_id, from_row.entrypoint, from_row.metadata) == (
        from_model.submission_id,
        from_model.entrypoint,
        from_model.metadata,
    )


def test_the_driver_exchanges_its_claim_once_and_holds_the_token_in_its_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("TRAINMASTER_JOB_ID", "job-1")
    monkeypatch.setenv("TRAINMASTER_API_URL", "http://api:8000")
    config = {"runtime_env": {}, "metadata": {"trainmaster_job_id": "job-1", "trainmaster_claim": "tm_claim"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(config))
    monkeypatch.setenv("TRAINMASTER_JOB_TOKEN", "")  # recorded, so the token claimed() sets is undone
    monkeypatch.setattr(time, "sleep", lambda _: None)
    asked: list[dict[str, Any]] = []
    answers: Iterator[Exception | httpx.Response] = iter(
        [
            httpx.ConnectError("down"),
            httpx.Response(503, json={"error": "DatabaseUnavailable"}),  # its database restarting
            httpx.Response(201, json={"token": "tm_token"}),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        reply = next(answers)
        if isinstance(reply, Exception):
            raise reply
        return reply

    context = JobContext.from_env()
    assert context is not None
    claimed = context.claimed(transport=httpx.MockTransport(answer))
    assert claimed.token == "tm_token" and claimed.claim is None
    assert asked == [{"job_id": context.job_id, "claim": "tm_claim"}] * 3  # down, then 503: asked again each time
    assert os.environ["TRAINMASTER_JOB_TOKEN"] == "tm_token"
    left = json.loads(os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"])  # what ray.init would record of the job
    assert left == {"runtime_env": {}, "metadata": {"trainmaster_job_id": "job-1"}}
    assert claimed.claimed() is claimed  # nothing left to claim

    refused = JobContext(job_id="j", api_url="http://api", claim="tm_used")
    with pytest.raises(ClaimRefused, match="401"):
        refused.claimed(transport=httpx.MockTransport(lambda _: httpx.Response(401, json={"error": "Unauthorized"})))
