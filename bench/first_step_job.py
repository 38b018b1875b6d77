"""Training function of bench/submit_latency.py: stamps the wall-clock time of the first step.

Every worker, just before its first training step, appends `<world rank> <time.time()>` to the
file `config["stamp_path"]` (rank 0's line is the first step; the latest line is when the whole gang
had started); then every worker does `config["steps"]` (default 3) tiny all-reduced steps and
returns. It imports nothing from trainmaster, so the same
function runs under the platform (function entrypoint `first_step_job:train_loop_per_worker`, with
this file as the job's whole working_dir) and under a bare `TorchTrainer.fit()`.
"""

from __future__ import annotations

import time
from typing import Any


def stamp(path: str, rank: int) -> None:
    """Append the rank and the current wall-clock time to `path` (one line; O_APPEND keeps lines whole)."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{rank} {time.time():.6f}\n")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    for step in range(int(config.get("steps", 3))):
        if step == 0:
            stamp(str(config["stamp_path"]), rank)
        value = torch.ones(4)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(value)
