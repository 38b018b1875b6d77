"""Case 3: three dispatchers over 100 queued jobs on a real Ray head: ledger lines = jobs.

Slow (15 to 25 minutes on 2 cores, so it has its own timeout): run with `scripts/test -m slow`,
and whenever the dispatcher changes. A small variation of it runs in every CI run: two dispatchers
over 6 one-worker jobs, more than fit at once (tests/e2e/test_ray_jobs.py); and three dispatchers race
over 30 jobs against the in-memory Ray in tests/integration/test_dispatcher.py.

It also writes where each job's start-up time goes (tests/reliability/startup_phases.json), from
the job's own events: queued -> admitted, admitted -> the driver's process started by Ray Jobs (the
job supervisor actor and the runtime env), the driver's Python start-up and imports, driver -> Ray
Train controller asking for its placement group, placement group -> workers started, workers ->
training code running, training -> end.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest

import trainmaster as tm
from tests.e2e.conftest import Stack
from tests.factories.jobs import TERMINAL, ledger_lines, small_mlp, wait_for_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]

JOBS = 100
PHASES = (
    "queued",
    "ray_job_start",
    "driver_imports",
    "driver_to_controller",
    "placement_and_workers",
    "workers_to_code",
    "run",
)


def startup_phases(client: tm.Client, job_id: str) -> dict[str, float]:
    """Seconds between the job's milestones, from the timestamps of its events."""
    events = client.events(job_id)
    job = client.get(job_id).info

    def first(kind: str, status: str | None = None) -> float | None:
        for event in events:
            if event.kind == kind and (status is None or (event.status and event.status.value == status)):
                return event.created_at.timestamp()
        return None

    driver = first("driver")
    startup_s = next((float(e.data.get("startup_s", 0)) for e in events if e.kind == "driver"), 0.0)
    marks = {
        "submitted": job.created_at.timestamp(),
        "admitted": first("status", "starting"),
        "driver_process": driver - startup_s if driver is not None else None,
        "driver": driver,
        "controller": first("gang_pending"),
        "workers": first("workers_started"),
        "code": first("runtime"),
        "end": job.finished_at.timestamp() if job.finished_at else None,
    }
    pairs = zip(PHASES, ("submitted", *list(marks)[1:-1]), list(marks)[1:], strict=True)
    return {name: marks[b] - marks[a] for name, a, b in pairs if marks[a] is not None and marks[b] is not None}


@pytest.mark.timeout(3600)
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
                done = wait_for_status(client, job_id, TERMINAL, timeout=max(1, deadline - time.monotonic()))
                assert done.status is tm.JobStatus.succeeded, done.error
    finally:
        for process in extra:
            process.terminate()
        with stack.client() as client:
            phases = [startup_phases(client, job_id) for job_id in ids]
        summary = {
            name: round(statistics.median(p[name] for p in phases if name in p), 2)
            for name in PHASES
            if any(name in p for p in phases)
        }
        summary["jobs"] = len(ids)
        Path(__file__).with_name("startup_phases.json").write_text(json.dumps(summary, indent=2))
        print("median seconds per start-up phase:", json.dumps(summary))
    launches = Counter(line[0] for line in ledger_lines(ledger))
    assert len(ledger_lines(ledger)) == JOBS
    assert sorted(launches) == sorted(ids) and set(launches.values()) == {1}
