"""Training function of bench/logging_overhead.py: a fixed small DDP step, timed on rank 0.

Every worker trains the same MLP (DDP through `prepare_model`, so each step all-reduces the gradients)
on one fixed random batch. After `warmup_steps` and a barrier, rank 0 times `steps` steps and appends
one JSON line to `config["result_path"]`. `mode` is the one thing that differs between jobs, the call
after each step (every mode calls `loss.item()`):

    none          nothing
    trainmaster   trainmaster.log({"loss": ...}, step=i)
    ray_report    ray.train.report({"loss": ..., "step": i})
    alternate     blocks of `block` steps, without and with trainmaster.log in turn, in the same
                  processes (warm-up logs, so the sender thread is running throughout): a pair of
                  neighbouring blocks shares the machine's state, which whole jobs a minute apart do not
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

MODES = ("none", "trainmaster", "ray_report", "alternate")


def train_loop_per_worker(config: dict[str, Any]) -> None:
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
    features, hidden = int(config.get("features", 256)), int(config.get("hidden", 256))
    mlp = [nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)]
    model = ray.train.torch.prepare_model(nn.Sequential(*mlp))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(int(config.get("batch", 64)), features)
    labels = torch.randint(0, 10, (len(inputs),))
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
            if mode in ("trainmaster", "alternate"):
                trainmaster.log({"loss": loss.item()}, step=step)
            elif mode == "ray_report":
                ray.train.report({"loss": loss.item(), "step": step})
            else:
                loss.item()
            durations.append(time.perf_counter() - started)
        return time.perf_counter() - began, time.process_time() - cpu_began, durations

    warmup, count = int(config.get("warmup_steps", 50)), int(config.get("steps", 2000))
    steps(0, warmup)
    dist.barrier()
    if mode == "alternate":  # `count` steps in blocks of `block`, logging in every second block
        block, blocks = int(config.get("block", 100)), []
        for n in range(count // block):
            dist.barrier()  # both ranks start the block together
            seconds, cpu_s, _ = steps(warmup + n * block, block, "alternate" if n % 2 else "none")
            blocks.append(
                {"logging": n % 2 == 1, "steps_per_s": block / seconds, "cpu_ms_per_step": cpu_s / block * 1000}
            )
        result: dict[str, Any] = {"mode": mode, "steps": count, "block": block, "blocks": blocks}
    else:
        seconds, cpu_s, durations = steps(warmup, count)
        result = {
            "mode": mode,
            "steps": count,
            "steps_per_s": count / seconds,
            "median_step_ms": statistics.median(durations) * 1000,
            "p99_step_ms": sorted(durations)[max(0, round(0.99 * count) - 1)] * 1000,
            "cpu_ms_per_step": cpu_s / count * 1000,
        }
    trainmaster.flush(timeout=60)
    if ray.train.get_context().get_world_rank() == 0:
        with open(str(config["result_path"]), "a", encoding="utf-8") as out:
            out.write(json.dumps(result) + "\n")
