"""Case 3: three dispatchers over 100 queued jobs on a real Ray head: ledger lines = jobs.

Slow (about 15 minutes on 2 cores): run with `scripts/test -m slow`. The two-dispatcher, 20-job
variation of it runs in every CI run (tests/e2e/test_ray_jobs.py), and three dispatchers race over
30 jobs against the in-memory Ray in tests/integration/test_dispatcher.py.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack
from tests.e2e.test_ray_jobs import TERMINAL, ledger_lines, small_mlp, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

JOBS = 100


def test_three_dispatchers_over_a_hundred_jobs(stack: Stack, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    extra = [stack.dispatchers.start("d2"), stack.dispatchers.start("d3")]
    try:
        with stack.client() as client:
            ids = [
                client.submit(
                    name=f"hundred-{i}",
                    entrypoint="builtin:mlp",
                    scaling=tm.Scaling(num_workers=1),
                    config=small_mlp(epochs=1, samples=64, ledger_path=str(ledger)),
                ).id
                for i in range(JOBS)
            ]
            deadline = time.monotonic() + 3600
            for job_id in ids:
                done = wait_for(client, job_id, TERMINAL, timeout=max(1, deadline - time.monotonic()))
                assert done.status is tm.JobStatus.succeeded, done.error
    finally:
        for process in extra:
            process.terminate()
    launches = Counter(line[0] for line in ledger_lines(ledger))
    assert len(ledger_lines(ledger)) == JOBS
    assert sorted(launches) == sorted(ids) and set(launches.values()) == {1}
