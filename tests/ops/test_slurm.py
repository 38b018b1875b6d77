"""Slurm for real: `sbatch platform/slurm/trainmaster.sbatch` on a one-node slurmctld + slurmd.

The allocation starts its own Ray cluster and a dispatcher on a database of its own (so no other
dispatcher of the session can take the job), which launches the job there. `scancel` of the allocation
takes the running job's Ray cluster away: the next allocation's dispatcher finds the attempt lost, says
why, and retries the job in its own Ray cluster, where it succeeds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from api.db import migrate
from api.stack.postgres import create_database, drop_database
from api.stack.ray_head import ray_port_flags
from tests.e2e.conftest import REPO, start_api, stop, wait_until
from tests.ops.slurm_cluster import SlurmCluster, missing_binaries, running_slurm
from trainmaster.ports import free_port

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(bool(missing_binaries()), reason=f"Slurm or munge missing: {missing_binaries()}"),
]

SBATCH = REPO / "platform" / "slurm" / "trainmaster.sbatch"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    scratch = Path(tempfile.mkdtemp(prefix="tmslurm-", dir="/tmp"))  # short: Ray's Unix sockets live below
    try:
        with running_slurm(scratch) as cluster:
            yield cluster
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def sbatch(slurm: SlurmCluster, env: dict[str, str], name: str) -> str:
    """Submits the platform's sbatch script as a user would, shaped to this one small node."""
    env = {
        **env,
        "RAY_TMPDIR": str(slurm.dir / f"ray-{name}"),
        "TRAINMASTER_SLURM_DIR": str(slurm.dir / f"run-{name}"),
        "RAY_START_ARGS": " ".join(ray_port_flags()),  # the session's own Ray head may run on this machine
    }
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--nodes=1",
        f"--cpus-per-task={os.cpu_count() or 1}",
        "--time=20",
        f"--output={slurm.dir}/log/allocation-{name}.log",
        str(SBATCH),
        env=env,
    )
    return out.strip().split(";")[0]


def environments(chosen: Callable[[str, dict[str, str]], bool]) -> dict[int, dict[str, str]]:
    """The environment of every process on this machine that `chosen(cmdline, environ)` picks."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            raw = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        environ = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if chosen(cmdline, environ):
            found[int(proc.name)] = environ
    return found


def wait_job(client: tm.Client, job_id: str, predicate: Any, timeout: float, what: str, slurm: SlurmCluster) -> tm.Job:
    def check() -> tm.Job | None:
        job = client.get(job_id).info
        return job if predicate(job) else None

    try:
        return wait_until(check, timeout, interval=0.5, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; job {client.get(job_id).info!r}\n{slurm.logs()}") from exc


def test_scancel_of_an_allocation_loses_its_running_attempt_and_the_next_allocation_retries_it(
    slurm: SlurmCluster, pg_server_url: str, tmp_path: Path
) -> None:
    database_url = create_database(pg_server_url, "tm_slurm")
    migrate.upgrade(database_url)
    api = start_api(database_url, tmp_path / "api.log")
    env = {
        **slurm.env,
        "TRAINMASTER_VENV": str(REPO / ".venv"),
        "TRAINMASTER_DATABASE_URL": database_url,
        "TRAINMASTER_API_URL": api.url,
        "TRAINMASTER_STORAGE_PATH": str(tmp_path / "storage"),  # shared by both allocations: retries resume
        "TRAINMASTER_POLL_INTERVAL_S": "1",
        "TRAINMASTER_LEASE_S": "8",
        "RAY_HEAD_IP": "127.0.0.1",
        "RAY_PORT": str(free_port(26379)),
        "RAY_DASHBOARD_PORT": str(free_port(28265)),
    }
    allocations: list[str] = []
    client = tm.Client(api.url, api.token)
    try:
        allocations.append(sbatch(slurm, env, "first"))
        # Two epochs with a checkpoint after each; the sleep keeps it running while the allocation ends.
        job = client.submit(
            name="slurm-lost",
            entrypoint="builtin:mlp",
            scaling=tm.Scaling(num_workers=1),
            config={"epochs": 2, "epoch_sleep_s": 5},
            max_retries=1,
        )
        wait_job(client, job.id, lambda j: j.status is tm.JobStatus.running, 180, "the job to run", slurm)
        # No Ray process of the allocation, and no process of the job, was given the database URL.
        ray_nodes = environments(lambda cmdline, _: str(slurm.dir / "ray-first") in cmdline and "raylet" in cmdline)
        job_processes = environments(lambda _, environ: environ.get("TRAINMASTER_JOB_ID") == job.id)
        assert ray_nodes and job_processes, (ray_nodes.keys(), job_processes.keys())
        for pid, environ in {**ray_nodes, **job_processes}.items():
            assert "TRAINMASTER_DATABASE_URL" not in environ, f"process {pid} holds the database URL"
            assert database_url not in "\0".join(environ.values()), f"process {pid} holds the database URL"
        slurm.run("scancel", allocations[0])
        wait_until(lambda: slurm.job_state(allocations[0]) == "", 90, interval=0.5, what="the allocation to end")

        allocations.append(sbatch(slurm, env, "second"))
        retried = wait_job(client, job.id, lambda j: j.status.terminal, 300, "the retried job to end", slurm)
        assert retried.status is tm.JobStatus.succeeded, retried.error
        first, second = retried.attempts
        assert first.status.value == "lost"
        assert first.error is not None and "Ray no longer knows this attempt" in first.error
        assert second.status.value == "succeeded"
        assert f'"submission_id": "{first.ray_submission_id}"' in slurm.allocation_log("first")
        assert f'"submission_id": "{second.ray_submission_id}"' in slurm.allocation_log("second")
        messages = [event.message or "" for event in client.events(job.id)]
        assert any(m.startswith("retry 1 of 1 after: lost") for m in messages), messages
    finally:
        for allocation in allocations:
            slurm.run("scancel", allocation, check=False)
        for allocation in allocations:
            wait_until(lambda a=allocation: slurm.job_state(a) == "", 90, interval=0.5, what="allocations to end")
        client.close()
        stop(api.process)
        drop_database(pg_server_url, database_url)
