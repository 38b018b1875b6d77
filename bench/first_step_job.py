"""Training function of bench/submit_latency.py and bench/torch_backend_startup.py: stamps the time of
the first step.

Every worker appends `<world rank> <time.time()>` to `config["stamp_path"]` just before its first step
(rank 0's line is the first step; the latest line is when the whole gang had started), then does
`config["steps"]` (default 3) tiny all-reduced steps, checking a gang's process group gives the right
sum. It imports nothing from trainmaster, so it runs alike under the platform (this file as the job's
whole working_dir) and under a bare `TorchTrainer.fit()` (`fit` here, the driver's side of the peers).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("no torch process group in a gang of several workers")
    for step in range(int(config.get("steps", 3))):
        if step == 0:  # one line; O_APPEND keeps lines whole
            with open(str(config["stamp_path"]), "a", encoding="utf-8") as out:
                out.write(f"{rank} {time.time():.6f}\n")
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


def fit(
    trainer: Callable[..., Any], name: str, workers: int, stamp: Path, storage: Path, strategy: str = "PACK"
) -> dict[str, float]:
    """A Ray Train trainer of this function (`trainer(**kwargs)`, built after t0) fitted from this driver:
    seconds from t0 to rank 0's first step, to every rank's, and to the end of `fit()`."""
    from ray.train import RunConfig, ScalingConfig

    t0 = time.time()
    result = trainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={"stamp_path": str(stamp)},
        scaling_config=ScalingConfig(num_workers=workers, placement_strategy=strategy),
        run_config=RunConfig(name=f"{name}-{uuid.uuid4().hex[:8]}", storage_path=str(storage)),
    ).fit()
    ended = time.time()
    if result.error is not None:
        raise RuntimeError(f"{name} failed: {result.error}")
    first, everyone = stamps(stamp, workers)
    return {"first_step_s": first - t0, "all_started_s": everyone - t0, "fit_s": ended - t0}
