"""A hostile tenant: code running as a job of one project tries what docs/security.md's threat model
lists against the platform and the other project on its cluster, through the real stack (API process,
dispatcher, the session's Ray head). Each attempt and how it was refused is asserted here; the job
writes them one per line (tests/security/probe/probe.py).

What one cluster cannot stop (processes of one uid read each other's /proc/<pid>/environ) is the
threat model's: that needs a cluster per trust domain. The second test runs the probe as a project of a
second Ray cluster (a second head, its own token) beside the session's: it reaches no Ray job of the
first. Both heads run as one OS user here, so a file of one (its token) is still readable from the
other: separate OS users per local cluster are not built (docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import trainmaster as tm
from api.auth.admin import project_token
from api.stack.ray_head import RayHead
from tests.e2e.conftest import Stack
from tests.e2e.ray_stack import start_ray_head, stop_ray_head
from tests.e2e.test_ray_jobs import TERMINAL, wait_for
from tests.factories.auth import scoped_token

pytestmark = pytest.mark.ray

PROBE = Path(__file__).parent / "probe"


def test_a_job_finds_no_credential_and_reaches_nothing_of_another_project(stack: Stack, tmp_path: Path) -> None:
    database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
    with tm.Client(stack.api.url, project_token(database_url, "tenant-a")) as tenant_a:
        # More workers than the cluster has CPUs: never launched (it ends infeasible), a job id of another
        # project to aim at.
        victim = tenant_a.submit(name="victim", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=64))
    job, seen = run_probe(stack, tmp_path, "tenant-b", victim.id, stack.ray.dashboard)
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
        "own token after its claim was replayed": 401,
    }
    assert {attempt: seen.get(attempt) for attempt in expected} == expected
    assert seen["Ray jobs listed through the Jobs API"] >= 1
    replays = seen["claims read from Ray jobs, replayed"]
    assert replays.get(job.id) == 401 and set(replays.values()) == {401}, replays


def run_probe(
    stack: Stack, tmp_path: Path, project: str, victim: str, dashboard: str, **env: str
) -> tuple[tm.Job, dict[str, Any]]:
    """tests/security/probe run as a job of `project`, to its end; what it tried, and each outcome."""
    out = tmp_path / "probe.jsonl"
    with tm.Client(stack.api.url, project_token(stack.api.env["TRAINMASTER_DATABASE_URL"], project)) as tenant:
        job = tenant.submit(
            name="hostile",
            entrypoint="script:probe.py",
            working_dir=PROBE,
            scaling=tm.Scaling(num_workers=1),
            env={"PROBE_OUT": str(out), "PROBE_VICTIM_JOB": victim, "PROBE_RAY_DASHBOARD": dashboard, **env},
        )
        done = wait_for(tenant, job.id, TERMINAL, timeout=300)
    assert done.status is tm.JobStatus.succeeded, done.error
    seen: dict[str, Any] = {}
    for line in out.read_text().splitlines():
        entry = json.loads(line)
        seen[entry["attempt"]] = entry["outcome"]
    assert "probe crashed" not in seen, seen
    return done, seen


@pytest.fixture(scope="module")
def east() -> Iterator[RayHead]:
    """A second Ray cluster beside the session's: its own head, token and session folder."""
    head = start_ray_head(num_cpus=2)
    yield head
    stop_ray_head(head)


def test_a_job_on_another_cluster_reaches_no_ray_job_of_the_first(stack: Stack, east: RayHead, tmp_path: Path) -> None:
    database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
    root = {"Authorization": f"Bearer {scoped_token(database_url)}"}
    with httpx.Client(base_url=stack.api.url, headers=root, timeout=30) as admin:
        cluster = {"name": "east", "address": east.dashboard, "token_file": str(east.token_path)}
        assert admin.post("/v1/clusters", json=cluster).status_code == 201
        assert admin.post("/v1/projects", json={"name": "tenant-east", "cluster": "east"}).status_code == 201
        with tm.Client(stack.api.url, project_token(database_url, "tenant-a")) as tenant_a:
            victim = tenant_a.submit(name="victim", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=64))

        # The dispatcher finds the new cluster (it reads the table every 10 s) and runs the job there alone.
        done, seen = run_probe(
            stack, tmp_path, "tenant-east", victim.id, east.dashboard, PROBE_OTHER_DASHBOARD=stack.ray.dashboard
        )
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

        info = admin.get("/v1/cluster", params={"name": "east"}).json()
        assert (info["name"], info["reachable"], info["total"]["CPU"]) == ("east", True, 2)
