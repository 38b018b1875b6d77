"""A hostile tenant: code running as a job of one project tries what docs/security.md's threat model
lists against the platform and the other project on its cluster, through the real stack (API process,
dispatcher, the session's Ray head). Each attempt and how it was refused is asserted here; the job
writes them one per line (tests/security/probe/probe.py).

What one cluster cannot stop (processes of one uid read each other's /proc/<pid>/environ) is the
threat model's: that needs a cluster per trust domain. So the probe also runs as a project of a second
Ray cluster (`east`: a second head, its own token) beside the session's: it reaches no Ray job of the
first. Run by root (as CI runs the suite), `east` runs as an OS user of its own (api/stack/osusers.py)
and the third test asserts what the OS refuses it: the API's environment, the first cluster's token,
session folder and checkpoints, the checkpoint root's listing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import trainmaster as tm
from api.auth.admin import project_token
from api.stack import osusers
from api.stack.osusers import OsUser
from api.stack.ray_head import RayHead
from tests.e2e.conftest import Stack
from tests.e2e.ray_stack import start_ray_head, stop_ray_head
from tests.factories.auth import scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import TERMINAL, wait_for_status

pytestmark = pytest.mark.ray

PROBE = Path(__file__).parent / "probe"

Probe = tuple[tm.Job, dict[str, Any]]
WARM_OF_THIS_UID = Path(f"/tmp/trainmaster-warm-{os.getuid()}")  # the session cluster's warm server (workers/warm/)


def run_probe(stack: Stack, project: str, victim: str, dashboard: str, user: OsUser | None = None, **env: str) -> Probe:
    """tests/security/probe run as a job of `project`, to its end; what it tried, and each outcome. Its
    output folder is the cluster user's when the cluster runs as one."""
    out = Path(tempfile.mkdtemp(prefix="tm-probe-", dir="/tmp"))
    if user is not None:
        os.chown(out, user.uid, user.gid)
    env = {"PROBE_OUT": str(out / "probe.jsonl"), "PROBE_VICTIM_JOB": victim, "PROBE_RAY_DASHBOARD": dashboard, **env}
    try:
        with tm.Client(stack.api.url, project_token(stack.api.env["TRAINMASTER_DATABASE_URL"], project)) as tenant:
            scaling = tm.Scaling(num_workers=1)
            job = tenant.submit(
                name="hostile", entrypoint="script:probe.py", working_dir=PROBE, scaling=scaling, env=env
            )
            done = wait_for_status(tenant, job.id, TERMINAL, timeout=300)
        assert done.status is tm.JobStatus.succeeded, done.error
        seen: dict[str, Any] = {}
        for line in (out / "probe.jsonl").read_text().splitlines():
            entry = json.loads(line)
            seen[entry["attempt"]] = entry["outcome"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert "probe crashed" not in seen, seen
    return done, seen


@pytest.fixture(scope="module")
def victim(stack: Stack) -> str:
    """A job of tenant-a with more workers than the cluster has CPUs: never launched (it ends infeasible),
    a job id of another project to aim at."""
    with tm.Client(stack.api.url, project_token(stack.api.env["TRAINMASTER_DATABASE_URL"], "tenant-a")) as tenant_a:
        return tenant_a.submit(name="victim", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=64)).id


@pytest.fixture(scope="module")
def first(stack: Stack, victim: str) -> Probe:
    """The probe as tenant-b on the session's cluster (it leaves a file in tenant-b's checkpoint folder)."""
    return run_probe(stack, "tenant-b", victim, stack.ray.dashboard)


def test_a_job_finds_no_credential_and_reaches_nothing_of_another_project(first: Probe) -> None:
    job, seen = first
    expected = {
        "job token handed to this worker inside Ray": True,  # it has one: every refusal below is real
        "platform secrets in this process's environment": [],
        "job token: write an event to its own job": 201,
        "job token: another project's job, write an event": 404,
        "job token: read another project's job": 401,
        "job token: list jobs": 401,
        "job token: submit a job at priority 100": 401,
        "job token: list clusters": 401,
        "no token: list tokens": 401,
        "job tokens read from any Ray job's runtime env": [],
        # A replay is refused and changes nothing: its own token still writes.
        "own token after its claim was replayed": 201,
        "credentials on any process's command line": [],
    }
    assert {attempt: seen.get(attempt) for attempt in expected} == expected
    assert seen["Ray jobs listed through the Jobs API"] >= 1
    replays = seen["claims read from Ray jobs, replayed"]
    assert replays.get(job.id) == 401 and set(replays.values()) == {401}, replays


@pytest.fixture(scope="module")
def east() -> Iterator[tuple[RayHead, OsUser | None]]:
    """A second Ray cluster beside the session's: its own head, token and session folder, and user."""
    user = osusers.usable_cluster_user("east")  # run as root with a Python others can run
    head = start_ray_head(num_cpus=2, user=user)
    yield head, user
    stop_ray_head(head)


@pytest.fixture(scope="module")
def on_east(stack: Stack, east: tuple[RayHead, OsUser | None], victim: str, first: Probe) -> Probe:
    """The probe as tenant-east on `east`, aimed at the session's cluster, the API and tenant-b's files."""
    head, user = east
    database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
    root = bearer(scoped_token(database_url))
    with httpx.Client(base_url=stack.api.url, headers=root, timeout=30) as admin:
        cluster = {"name": "east", "address": head.dashboard, "token_file": str(head.token_path)}
        assert admin.post("/v1/clusters", json=cluster).status_code == 201
        assert admin.post("/v1/projects", json={"name": "tenant-east", "cluster": "east"}).status_code == 201
    # The dispatcher finds the new cluster (it reads the table every 10 s) and runs the job there alone.
    return run_probe(
        stack, "tenant-east", victim, head.dashboard, user,
        PROBE_OTHER_DASHBOARD=stack.ray.dashboard,
        PROBE_API_PID=str(stack.api.process.pid),
        PROBE_OTHER_TOKEN=str(stack.ray.token_path),
        PROBE_OTHER_SESSION=str(stack.ray.temp_dir),
        PROBE_VICTIM_STORAGE=first[1]["own checkpoint folder"],
        PROBE_OTHER_WARM=str(WARM_OF_THIS_UID),
    )  # fmt: skip


def test_a_job_on_another_cluster_reaches_no_ray_job_of_the_first(
    stack: Stack, east: tuple[RayHead, OsUser | None], on_east: Probe
) -> None:
    done, seen = on_east
    assert done.cluster == "east"
    submission = done.attempts[-1].ray_submission_id
    first = httpx.get(f"{stack.ray.dashboard}/api/jobs/", headers=stack.ray.headers(), timeout=30).json()
    assert submission not in {job["submission_id"] for job in first}  # never launched on the first cluster
    assert submission in seen["Ray submission ids listed"]
    assert not set(seen["Ray submission ids listed"]) & {job["submission_id"] for job in first}
    refused = seen["another cluster's Ray jobs listed"]
    assert isinstance(refused, str) and refused.startswith("refused"), refused
    assert seen["platform secrets in this process's environment"] == []
    assert seen["job token: read another project's job"] == 401
    assert seen["job tokens read from any Ray job's runtime env"] == []
    headers = bearer(scoped_token(stack.api.env["TRAINMASTER_DATABASE_URL"]))
    with httpx.Client(base_url=stack.api.url, headers=headers) as admin:
        info = admin.get("/v1/cluster", params={"name": "east"}).json()
    assert (info["name"], info["reachable"], info["total"]["CPU"]) == ("east", True, 2)


def test_a_job_of_a_cluster_run_as_another_os_user_reads_nothing_of_the_first(
    stack: Stack, east: tuple[RayHead, OsUser | None], first: Probe, on_east: Probe
) -> None:
    _, user = east
    if user is None:
        pytest.skip("clusters of one OS user are one trust domain: run as root, with a Python other users can run")
    _, seen = on_east
    # What it aims at is there, and would give it something: the API's environment holds the database
    # URL, tenant-b's folder holds the file the first probe left.
    assert "TRAINMASTER_DATABASE_URL" in Path(f"/proc/{stack.api.process.pid}/environ").read_text(errors="replace")
    victim_folder = Path(first[1]["own checkpoint folder"])
    assert (victim_folder / "probe-secret").is_file()
    own = Path(seen["own checkpoint folder"])
    assert own.owner() == user.name and own.parent == victim_folder.parent  # one checkpoint root for both
    expected = {
        "other users' processes whose environment this job read": [],
        "the API process's environment": "refused: PermissionError",
        "the other cluster's Ray token file": "refused: PermissionError",
        "the other cluster's session folder listed": "refused: PermissionError",
        "the checkpoint root listed": "refused: PermissionError",
        "another project's checkpoint folder listed": "refused: PermissionError",
        "another project's checkpoint read": "refused: PermissionError",
        "another project's checkpoint folder written": "refused: PermissionError",
    }
    if WARM_OF_THIS_UID.is_dir():  # the first probe's driver started through it (TRAINMASTER_WARM_DRIVER)
        expected["the other cluster's warm server folder listed"] = "refused: PermissionError"
    assert {attempt: seen.get(attempt) for attempt in expected} == expected
    assert not (victim_folder / "planted").exists()
