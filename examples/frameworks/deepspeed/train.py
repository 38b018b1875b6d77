"""A plain DeepSpeed script (ZeRO stage 1), as DeepSpeed's getting-started guide writes it, on CPUs.

Alone:        python train.py                (one process)
Distributed:  deepspeed / torchrun --nproc-per-node 2 train.py, or trainmaster's script mode (see
              ../submit.py): every worker runs this file with torchrun's environment, which
              `deepspeed.init_distributed()` reads. Without GPUs DeepSpeed picks its CPU accelerator and
              gloo (oneCCL when `oneccl_bindings_for_pytorch` is installed). framework stays "torch".
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
from deepspeed import comm
from torch import nn

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster

CONFIG = {
    "train_micro_batch_size_per_gpu": 32,
    # torch_adam: torch.optim.Adam; DeepSpeed's own (FusedAdam, CPUAdam) compile C++ ops at first use
    "optimizer": {"type": "Adam", "params": {"lr": 0.05, "torch_adam": True}},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1000,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", help="write what this rank saw here")
    args = parser.parse_args()

    deepspeed.init_distributed()
    model = nn.Linear(4, 1)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    rank, world = comm.get_rank(), comm.get_world_size()
    generator = torch.Generator().manual_seed(rank)  # each rank draws its own shard
    for step in range(args.steps):
        inputs = torch.randn(32, 4, generator=generator)
        targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        loss = nn.functional.mse_loss(engine(inputs), targets)
        engine.backward(loss)
        engine.step()
        trainmaster.log({"loss": loss.item()}, step=step)

    total = torch.tensor(float(rank + 1))
    comm.all_reduce(total)  # 1 + 2 + ... + world
    trainmaster.flush()
    print(f"rank {rank}/{world}: all-reduce of rank+1 = {total.item()}, loss {loss.item():.4f}", flush=True)
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"world_size": world, "rank": rank, "allreduce": total.item(), "loss": loss.item()}, f)


if __name__ == "__main__":
    main()
