"""Forwards what Ray Train's controller sees to trainmaster: reported metrics and checkpoints.

Runs inside the TrainController actor (registered through RunConfig.callbacks), whose environment
carries the job's id and token like every other process of the job.
"""

from __future__ import annotations

import math
import os
from typing import Any

import httpx
from ray.train import UserCallback

import trainmaster


class TrainmasterCallback(UserCallback):
    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        rank0 = metrics[0] if metrics else {}
        numbers = {k: float(v) for k, v in rank0.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        step = _step_of(rank0)
        if numbers:
            trainmaster.log({f"report/{k}": v for k, v in numbers.items()}, step=step)
        if checkpoint is not None:
            record_checkpoint(str(checkpoint.path), step, {k: v for k, v in numbers.items() if math.isfinite(v)})


def _step_of(metrics: dict[str, Any]) -> int | None:
    for key in ("step", "epoch", "iteration"):
        value = metrics.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return None


def record_checkpoint(path: str, step: int | None, metrics: dict[str, float]) -> None:
    api_url, job_id, token = (
        os.environ.get(k) for k in ("TRAINMASTER_API_URL", "TRAINMASTER_JOB_ID", "TRAINMASTER_JOB_TOKEN")
    )
    if not (api_url and job_id and token):
        return
    try:
        httpx.post(
            f"{api_url}/v1/jobs/{job_id}/checkpoints",
            params={"attempt": os.environ.get("TRAINMASTER_ATTEMPT") or None},
            json={"path": path, "step": step, "metrics": metrics},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
    except httpx.HTTPError as exc:
        print(f"[trainmaster] could not record checkpoint {path}: {exc}", flush=True)
