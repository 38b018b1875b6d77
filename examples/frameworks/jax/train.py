"""A plain JAX data-parallel program: `pmap` with `psum` over every device of every process.

Alone:        python train.py                (one process)
Distributed:  `framework="jax"`: in script mode (see ../submit.py) trainmaster runs this file under
              mpirun across the gang, and `jax.distributed.initialize()` finds Open MPI by itself, as
              JAX documents; in function mode (`entrypoint="train:train_loop_per_worker"`) Ray Train's
              JaxTrainer has joined every worker to jax.distributed before the function runs.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import jax
import jax.numpy as jnp

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster


def train(steps: int, out: str | None) -> None:
    rank, world = jax.process_index(), jax.process_count()
    all_sum = jax.pmap(lambda value: jax.lax.psum(value, "devices"), axis_name="devices")
    local = jax.local_device_count()
    total = float(all_sum(jnp.full((local,), float(rank + 1)))[0])  # 1 + 2 + ... + world

    def loss_of(weights: jax.Array, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        return jnp.mean((inputs @ weights - targets) ** 2)

    def step(weights: jax.Array, inputs: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
        loss, gradient = jax.value_and_grad(loss_of)(weights, inputs, targets)
        gradient = jax.lax.pmean(gradient, "devices")  # averaged over the whole gang
        return weights - 0.1 * gradient, jax.lax.pmean(loss, "devices")

    parallel_step = jax.pmap(step, axis_name="devices")
    key = jax.random.fold_in(jax.random.PRNGKey(0), rank)  # each process draws its own shard
    inputs = jax.random.normal(key, (local, 256, 4))
    targets = inputs @ jnp.array([1.0, -2.0, 0.5, 3.0])
    weights = jnp.zeros((local, 4))
    for index in range(steps):
        weights, loss = parallel_step(weights, inputs, targets)
        trainmaster.log({"loss": float(loss[0])}, step=index)
    trainmaster.flush()
    print(f"process {rank}/{world}: all-reduce of rank+1 = {total}, loss {float(loss[0]):.4f}", flush=True)
    if out:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"world_size": world, "rank": rank, "allreduce": total, "loss": float(loss[0])}, f)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Function mode: JaxTrainer already called jax.distributed.initialize() in this worker."""
    train(config.get("steps", 20), config.get("out"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", help="write what this process saw here")
    args = parser.parse_args()
    if "OMPI_COMM_WORLD_SIZE" in os.environ:  # started by mpirun: join the other processes
        jax.distributed.initialize()
    train(args.steps, args.out)
