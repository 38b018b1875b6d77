"""Training function of bench/submit_latency.py: stamps the wall-clock time of the first step.

Every worker, just before its first training step, appends `<world rank> <time.time()>` to the
file `config["stamp_path"]` (rank 0's line is the first step; the latest line is when the whole gang
had started); then every worker does `config["steps"]` (default 3) tiny all-reduced steps and
returns; a gang of several must hold a torch process group whose all-reduce is right. It imports
nothing from trainmaster, so the same function runs under the platform (function entrypoint
`first_step_job:train_loop_per_worker`, with this file as the job's whole working_dir) and under a
bare `TorchTrainer.fit()`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def stamp(path: str, rank: int) -> None:
    """Append the rank and the current wall-clock time to `path` (one line; O_APPEND keeps lines whole)."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{rank} {time.time():.6f}\n")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("no torch process group in a gang of several workers")
    for step in range(int(config.get("steps", 3))):
        if step == 0:
            stamp(str(config["stamp_path"]), rank)
        value = torch.ones(4)
        if world > 1:
            dist.all_reduce(value)
            if value.tolist() != [float(world)] * 4:
                raise RuntimeError(f"all-reduce of ones over {world} workers gave {value.tolist()}")


def stamps(stamp: Path, workers: int) -> tuple[float, float]:
    """(rank 0's first step, the last rank's first step) from the run's stamp file."""
    lines = [line.split() for line in stamp.read_text().splitlines()] if stamp.exists() else []
    by_rank = {int(rank): float(at) for rank, at in lines}
    if len(lines) != workers or sorted(by_rank) != list(range(workers)):
        raise RuntimeError(f"{stamp}: expected one first-step stamp per rank of {workers}, found {lines}")
    return by_rank[0], max(by_rank.values())
