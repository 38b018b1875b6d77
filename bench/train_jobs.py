"""Training functions that bench/ runs as jobs (this file is the job's whole working_dir) and as peers.

`first_step` (submit_latency.py): every worker appends `<world rank> <time.time()>` to
`config["stamp_path"]` just before its first step (rank 0's line is the first step, the latest line when
the whole gang had started), then does a few all-reduced steps, checking the gang's process group gives
the right sum. It imports nothing from trainmaster, so it runs alike under the platform and under a bare
`fit()` (`fit` here, the peers' driver side).

`step_loop` (logging_overhead.py): every worker trains the same MLP (DDP through `prepare_model`, so each
step all-reduces the gradients) on one fixed batch; after `warmup_steps` and a barrier rank 0 times
`steps` steps and appends one JSON line to `config["result_path"]`. `mode` is what follows each step:
nothing (`none`), `trainmaster.log` (`trainmaster`), or blocks of `block` steps without and with it in
turn (`alternate`; warm-up logs, so the sender thread runs throughout).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("none", "trainmaster", "alternate")


def first_step(config: dict[str, Any]) -> None:
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
    """A Ray Train trainer of `first_step` (`trainer(**kwargs)`, built after t0) fitted from this driver:
    seconds from t0 to rank 0's first step, to every rank's, and to the end of `fit()`."""
    from ray.train import RunConfig, ScalingConfig

    t0 = time.time()
    result = trainer(
        train_loop_per_worker=first_step,
        train_loop_config={"stamp_path": str(stamp)},
        scaling_config=ScalingConfig(num_workers=workers, placement_strategy=strategy),
        run_config=RunConfig(name=f"{name}-{uuid.uuid4().hex[:8]}", storage_path=str(storage)),
    ).fit()
    ended = time.time()
    if result.error is not None:
        raise RuntimeError(f"{name} failed: {result.error}")
    first, everyone = stamps(stamp, workers)
    return {"first_step_s": first - t0, "all_started_s": everyone - t0, "fit_s": ended - t0}


def step_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from torch import nn

    import trainmaster

    mode = str(config.get("mode", "none"))
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    torch.manual_seed(0)
    mlp = [nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)]
    model = ray.train.torch.prepare_model(nn.Sequential(*mlp))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(64, 256), torch.randint(0, 10, (64,))
    loss_fn = nn.CrossEntropyLoss()

    def steps(first: int, count: int, mode: str = mode) -> tuple[float, float, list[float]]:
        """Wall and CPU seconds (rank 0's process, all threads) of `count` steps, and each step's."""
        durations = []
        began, cpu_began = time.perf_counter(), time.process_time()
        for step in range(first, first + count):
            started = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            if mode == "none":
                loss.item()
            else:
                trainmaster.log({"loss": loss.item()}, step=step)
            durations.append(time.perf_counter() - started)
        return time.perf_counter() - began, time.process_time() - cpu_began, durations

    warmup, count = int(config.get("warmup_steps", 50)), int(config.get("steps", 2000))
    steps(0, warmup)
    dist.barrier()
    result: dict[str, Any] = {"mode": mode, "steps": count}
    if mode == "alternate":  # `count` steps in blocks of `block`, logging in every second block
        block, blocks = int(config.get("block", 100)), []
        for n in range(count // block):
            dist.barrier()  # both ranks start the block together
            seconds, cpu_s, _ = steps(warmup + n * block, block, "alternate" if n % 2 else "none")
            blocks.append(
                {"logging": n % 2 == 1, "steps_per_s": block / seconds, "cpu_ms_per_step": cpu_s / block * 1000}
            )
        result |= {"block": block, "blocks": blocks}
    else:
        seconds, cpu_s, durations = steps(warmup, count)
        result |= {
            "steps_per_s": count / seconds,
            "median_step_ms": statistics.median(durations) * 1000,
            "p99_step_ms": sorted(durations)[max(0, round(0.99 * count) - 1)] * 1000,
            "cpu_ms_per_step": cpu_s / count * 1000,
        }
    trainmaster.flush(timeout=60)
    if ray.train.get_context().get_world_rank() == 0:
        with open(str(config["result_path"]), "a", encoding="utf-8") as out:
            out.write(json.dumps(result) + "\n")
