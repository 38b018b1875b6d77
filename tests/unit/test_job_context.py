"""The job's environment is written in one place (the dispatcher's launch) and read in one place."""

from __future__ import annotations

import uuid

from api.db.models import Job
from api.dispatcher import launch
from api.settings import Settings
from trainmaster.context import JobContext
from trainmaster.models import JobSpec


def launched_env(settings: Settings, spec: JobSpec) -> dict[str, str]:
    job = Job(id=uuid.uuid4(), name=spec.name, spec=spec.model_dump(mode="json"))
    built = launch.build(settings, job, spec, 3, "tm_job_token")
    env = built.runtime_env["env_vars"]
    assert isinstance(env, dict)
    return env


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
    assert context.api_url == "http://api:8000" and context.token == "tm_job_token"
    assert context.storage_path == "/mnt/ckpt"
    assert context.collective_timeout_s == 90
    assert context.system_metrics_interval_s == 0.5  # the documented setting reaches the workers
    assert JobSpec.model_validate_json(context.spec_json or "") == spec
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_a_jobs_env_cannot_impersonate_another_job_but_may_set_its_collective_timeout() -> None:
    spec = JobSpec(
        name="ctx",
        entrypoint="builtin:mlp",
        env={"TRAINMASTER_JOB_ID": "someone-else", "TRAINMASTER_COLLECTIVE_TIMEOUT_S": "12"},
    )
    context = JobContext.from_env(launched_env(Settings(), spec))
    assert context is not None
    assert context.job_id != "someone-else"
    assert context.collective_timeout_s == 12


def test_outside_a_job_there_is_no_context() -> None:
    assert JobContext.from_env({"TRAINMASTER_API_URL": "http://api"}) is None


def test_an_admission_round_launches_from_the_stored_spec_what_the_model_would_launch() -> None:
    """Admission builds launches from the spec as the jobs table holds it (LaunchSpec.stored), not
    from a validated JobSpec: the driver reads back the same spec and every other part is equal."""
    spec = JobSpec(name="ctx", entrypoint="builtin:mlp", env={"NCCL_SOCKET_IFNAME": "eth0"}, pip=["einops==0.8.0"])
    job = Job(id=uuid.uuid4(), name=spec.name, spec=spec.model_dump(mode="json"))
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
