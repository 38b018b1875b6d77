"""Forwards what Ray Train's controller sees to trainmaster: reported metrics and checkpoints.

Runs inside the TrainController actor (registered through RunConfig.callbacks), whose environment
carries the job's id and token like every other process of the job.
"""

from __future__ import annotations

import math
from typing import Any

from ray.train import UserCallback

import trainmaster
from trainmaster.context import record_checkpoint


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
