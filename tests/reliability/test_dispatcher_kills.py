"""Case 2: SIGKILL the dispatcher at each point of a launch, twice each by default, on a real Ray head
(TRAINMASTER_RELIABILITY_KILLS=21 for the long campaign).

After the claim commits, after the Ray submit and before the attempt is marked, and while
reconciling. Then one clean dispatcher finishes the work. Every job is launched exactly once (counted
from a ledger the training code writes), nothing stays `starting`, and Ray runs no trainmaster job
the database does not know.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import trainmaster as tm
from api.dispatcher.faults import POINTS
from tests.e2e.conftest import running_stack
from tests.factories.jobs import TERMINAL, ledger_lines, small_mlp, wait_for_status

pytestmark = pytest.mark.ray

KILLS = int(os.environ.get("TRAINMASTER_RELIABILITY_KILLS", str(2 * len(POINTS))))


def test_sigkill_at_every_launch_point_launches_each_attempt_once(
    pg_server_url: str, ray_head: Any, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    with running_stack(pg_server_url, ray_head, tmp_path) as stack, stack.client() as client:
        stack.dispatchers.stop_all()
        fast_leases = {"TRAINMASTER_LEASE_S": "2"}  # a killed dispatcher's jobs are taken over quickly
        ids = [
            client.submit(
                name=f"kill-{i}",
                entrypoint="builtin:mlp",
                scaling=tm.Scaling(num_workers=1),
                config=small_mlp(epochs=1, samples=64, ledger_path=str(ledger)),
            ).id
            for i in range(KILLS)
        ]
        kills: Counter[str] = Counter()
        for i in range(KILLS):
            point = POINTS[i % len(POINTS)]
            process = stack.dispatchers.start(f"doomed-{i}", {**fast_leases, "TRAINMASTER_FAULT_POINT": point})
            try:
                code = process.wait(timeout=180)
            except subprocess.TimeoutExpired:  # never reached the point (nothing to admit): not a kill
                process.terminate()
                code = process.wait(30)
            if code == -signal.SIGKILL:
                kills[point] += 1
        assert sum(kills.values()) >= KILLS - 1, kills  # one may find nothing left to admit
        assert set(kills) == set(POINTS), kills

        stack.dispatchers.start("survivor", fast_leases)
        for job_id in ids:
            done = wait_for_status(client, job_id, TERMINAL, timeout=900)
            assert done.status is tm.JobStatus.succeeded, (job_id, done.error)
            assert [a.n for a in done.attempts] == [1]

        known = {a.ray_submission_id for job_id in ids for a in client.get(job_id).info.attempts}
    launches = Counter((line[0], line[1]) for line in ledger_lines(ledger))
    assert sorted(job for job, _ in launches) == sorted(ids), "every job launched"
    assert set(launches.values()) == {1}, f"launched twice: {[k for k, v in launches.items() if v > 1]}"

    from ray.job_submission import JobSubmissionClient

    ray_ids = {
        job.submission_id
        for job in JobSubmissionClient(ray_head.dashboard, headers=ray_head.headers()).list_jobs()
        if (job.submission_id or "").startswith("tm-") and any(i in job.submission_id for i in ids)
    }
    assert ray_ids == known
