"""Training function of bench/logging_overhead.py: a fixed small DDP step, timed on rank 0.

Every worker builds the same MLP (`prepare_model` wraps it in DDP, so each step all-reduces the
gradients over gloo) and trains it on one fixed random batch. After `warmup_steps` unmeasured
steps and a barrier, rank 0 times `steps` steps with `time.perf_counter()` and appends one JSON
line (mode, steps, seconds, steps/s, step-time statistics, and the CPU time of rank 0's process,
all threads, and of its main thread over the loop) to `config["result_path"]`. `mode` is what
happens after each step, the only thing that differs between runs:

    none          nothing
    trainmaster   trainmaster.log({"loss": ...}, step=i)
    ray_report    ray.train.report({"loss": ..., "step": i})

Every mode calls `loss.item()`, so the modes differ by the logging call alone. After the timed loop
rank 0 also times `trainmaster.flush()` (unmeasured by the loop; the driver calls it anyway).
Submitted by the benchmark as `step_loop_job:train_loop_per_worker` with this file as working_dir.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

MODES = ("none", "trainmaster", "ray_report")


def make_batch(config: dict[str, Any]) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(int(config.get("batch", 64)), int(config.get("features", 256)), generator=generator)
    labels = torch.randint(0, int(config.get("classes", 10)), (len(inputs),), generator=generator)
    return inputs, labels


def make_model(config: dict[str, Any]) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    features, hidden, classes = (
        int(config.get(k, d)) for k, d in (("features", 256), ("hidden", 256), ("classes", 10))
    )
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def after_step(mode: str, loss: float, step: int) -> None:
    if mode == "trainmaster":
        import trainmaster

        trainmaster.log({"loss": loss}, step=step)
    elif mode == "ray_report":
        import ray.train

        ray.train.report({"loss": loss, "step": step})


def run_steps(model: Any, optimizer: Any, batch: tuple[Any, Any], mode: str, first: int, count: int) -> list[float]:
    """`count` steps numbered from `first`; returns each step's duration in seconds."""
    import time as clock

    from torch import nn

    loss_fn = nn.CrossEntropyLoss()
    inputs, labels = batch
    durations = []
    for step in range(first, first + count):
        began = clock.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        after_step(mode, loss.item(), step)
        durations.append(clock.perf_counter() - began)
    return durations


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    import trainmaster

    mode = str(config.get("mode", "none"))
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    steps, warmup_steps = int(config.get("steps", 2000)), int(config.get("warmup_steps", 50))
    model = ray.train.torch.prepare_model(make_model(config))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = make_batch(config)
    run_steps(model, optimizer, batch, mode, 0, warmup_steps)
    dist.barrier()
    began, cpu_began, thread_began = time.perf_counter(), time.process_time(), time.thread_time()
    durations = run_steps(model, optimizer, batch, mode, warmup_steps, steps)
    seconds = time.perf_counter() - began
    process_cpu_s, thread_cpu_s = time.process_time() - cpu_began, time.thread_time() - thread_began
    flush_began = time.perf_counter()
    flushed = trainmaster.flush(timeout=60)
    flush_s = time.perf_counter() - flush_began
    context = ray.train.get_context()
    if context.get_world_rank() == 0:
        result = {
            "mode": mode,
            "steps": steps,
            "warmup_steps": warmup_steps,
            "seconds": seconds,
            "steps_per_s": steps / seconds,
            "median_step_ms": statistics.median(durations) * 1000,
            "mean_step_ms": statistics.fmean(durations) * 1000,
            "p99_step_ms": sorted(durations)[max(0, round(0.99 * len(durations)) - 1)] * 1000,
            "max_step_ms": max(durations) * 1000,
            "process_cpu_s": process_cpu_s,
            "main_thread_cpu_s": thread_cpu_s,
            "torch_threads": torch.get_num_threads(),
            "world_size": context.get_world_size(),
            "flush_s": flush_s,
            "flushed": flushed,
        }
        with open(str(config["result_path"]), "a", encoding="utf-8") as out:
            out.write(json.dumps(result) + "\n")
