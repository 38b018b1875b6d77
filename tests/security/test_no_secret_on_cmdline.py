"""No credential of a running job is on any process's command line, which every local user reads
(/proc/<pid>/cmdline), a job of another cluster run as another OS user included. Ray writes a job's
runtime environment variables into the command line of every worker process it starts for the job
(its job supervisor, the Ray Train controller, the workers), so the launch's claim must travel
elsewhere (the Ray job's metadata), and the job token and the Ray cluster's token never in one. One
small job on the session's real stack: while it runs, every command line on the machine is read."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack
from tests.factories.jobs import TERMINAL, wait_for_status
from tests.factories.waiting import wait_until

pytestmark = pytest.mark.ray

# Runs as the job's one worker: hands the test the job token it holds, then waits to be told to end.
JOB = """
import os, time
from pathlib import Path

out = Path(os.environ["CMDLINE_OUT"])
Path(f"{out}.tmp").write_text(os.environ.get("TRAINMASTER_JOB_TOKEN", ""))
os.replace(f"{out}.tmp", out)
deadline = time.monotonic() + 180
while not Path(os.environ["CMDLINE_STOP"]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
"""


class CommandLines(threading.Thread):
    """Every distinct command line on the machine, read again and again until stopped: Ray's
    setup_worker.py carries a worker's runtime environment on its command line only while it prepares
    the worker (it then execs the worker), so a single look would miss it, as an attacker polling would not."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: dict[str, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue  # ended meanwhile
                self.seen.setdefault(line, int(pid))
            self.done.wait(0.005)

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.join()
        return self.seen


def test_no_claim_job_token_or_ray_token_is_on_any_command_line_while_a_job_starts_and_runs(
    stack: Stack, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    token_file, stop = tmp_path / "token", tmp_path / "stop"
    env = {"CMDLINE_OUT": str(token_file), "CMDLINE_STOP": str(stop)}
    scan = CommandLines()
    scan.start()
    with stack.client() as client:
        try:
            one = tm.Scaling(num_workers=1)
            job = client.submit(name="cmdline", entrypoint="script:job.py", working_dir=code, scaling=one, env=env)
            token = wait_until(lambda: token_file.is_file() and token_file.read_text(), 300, what="the job's worker")
            ray_job = httpx.get(
                f"{stack.ray.dashboard}/api/jobs/tm-{job.id}-1", headers=stack.ray.headers(), timeout=30
            )
        finally:
            lines = scan.stop()
            stop.touch()
        done = wait_for_status(client, job.id, TERMINAL)
    assert done.status is tm.JobStatus.succeeded, done.error
    claim = ray_job.json()["metadata"]["trainmaster_claim"]
    secrets = {"claim": claim, "job token": token, "Ray token": stack.ray.token_path.read_text().strip()}
    assert token.startswith("tm_") and claim.startswith("tm_") and len(secrets["Ray token"]) >= 32
    # The scan saw Ray prepare the job's workers, with the runtime environment on their command lines.
    prepared = [line for line in lines if "runtime-env-context" in line and job.id in line]
    assert prepared, [line[:300] for line in lines if "setup_worker" in line or job.id in line]
    found = {
        f"{name} in {pid}: {line[:300]}" for line, pid in lines.items() for name, s in secrets.items() if s in line
    }
    assert found == set()
