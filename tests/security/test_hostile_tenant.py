"""A hostile tenant: code running as a job of one project tries what docs/security.md's threat model
lists against the platform and the other project on its cluster, through the real stack (API process,
dispatcher, the session's Ray head). Each attempt and how it was refused is asserted here; the job
writes them one per line (tests/security/probe/probe.py).

What one cluster cannot stop (processes of one uid read each other's /proc/<pid>/environ) is the
threat model's, not this suite's: that needs a cluster per trust domain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from api.auth.admin import project_token
from tests.e2e.conftest import Stack
from tests.e2e.test_ray_jobs import TERMINAL, wait_for

pytestmark = pytest.mark.ray

PROBE = Path(__file__).parent / "probe"


def test_a_job_finds_no_credential_and_reaches_nothing_of_another_project(stack: Stack, tmp_path: Path) -> None:
    database_url = stack.api.env["TRAINMASTER_DATABASE_URL"]
    with tm.Client(stack.api.url, project_token(database_url, "tenant-a")) as tenant_a:
        # More workers than the cluster has CPUs: never launched (it ends infeasible), a job id of another
        # project to aim at.
        victim = tenant_a.submit(name="victim", entrypoint="builtin:mlp", scaling=tm.Scaling(num_workers=64))
    out = tmp_path / "probe.jsonl"
    with tm.Client(stack.api.url, project_token(database_url, "tenant-b")) as tenant_b:
        job = tenant_b.submit(
            name="hostile",
            entrypoint="script:probe.py",
            working_dir=PROBE,
            scaling=tm.Scaling(num_workers=1),
            env={"PROBE_OUT": str(out), "PROBE_VICTIM_JOB": victim.id, "PROBE_RAY_DASHBOARD": stack.ray.dashboard},
        )
        done = wait_for(tenant_b, job.id, TERMINAL, timeout=300)
    assert done.status is tm.JobStatus.succeeded, done.error
    seen: dict[str, Any] = {}
    for line in out.read_text().splitlines():
        entry = json.loads(line)
        seen[entry["attempt"]] = entry["outcome"]
    assert "probe crashed" not in seen, seen
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
