"""Jobs: a spec to submit, the small MLP the real-Ray tests train, the ledger its training code appends
each launch to, and a wait for a job's status through the SDK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trainmaster as tm
from tests.factories.waiting import wait_until

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mlp-test",
        "entrypoint": "builtin:mlp",
        "scaling": {"num_workers": 2},
        "config": {"epochs": 1},
    }
    body.update(overrides)
    return body


def small_mlp(**config: Any) -> dict[str, Any]:
    return {"epochs": 2, "samples": 256, "batch_size": 64, **config}


def ledger_lines(path: Path) -> list[list[str]]:
    """The launches the training code recorded (`ledger_path`): one line each, job id and attempt first."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_status(client: tm.Client, job_id: str, statuses: set[str], timeout: float = 240) -> tm.Job:
    """The job once its status is one of `statuses`; a job that ends otherwise fails the wait at once."""

    def reached() -> tm.Job | None:
        job = client.get(job_id).info
        if job.status.value in statuses:
            return job
        if job.status.value in TERMINAL:
            raise AssertionError(f"job ended {job.status.value} ({job.error}) while waiting for {statuses}")
        return None

    return wait_until(reached, timeout, interval=0.5, what=f"job {job_id} to become {statuses}")
