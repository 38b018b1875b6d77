"""A plain Horovod (PyTorch) script, as Horovod's docs write it.

Alone:        python train.py                (hvd.init() in a world of one)
Distributed:  horovodrun -np 2 python train.py / mpirun -np 2 python train.py, or trainmaster's
              `framework="horovod"` (see ../submit.py), which runs it under mpirun across the gang.
Needs Horovod built with MPI and PyTorch support (HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1).
"""

from __future__ import annotations

import argparse
import json
import os

import horovod.torch as hvd
import torch
from torch import nn

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", help="write what this rank saw here")
args = parser.parse_args()

hvd.init()
rank, world = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor(float(rank + 1)), op=hvd.Sum).item()  # 1 + 2 + ... + world

model = nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * world))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
generator = torch.Generator().manual_seed(rank)  # each rank draws its own shard
for step in range(args.steps):
    inputs = torch.randn(32, 4, generator=generator)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()  # gradients averaged across ranks
    trainmaster.log({"loss": loss.item()}, step=step)
trainmaster.flush()
print(f"rank {rank}/{world}: all-reduce of rank+1 = {total}, loss {loss.item():.4f}", flush=True)
if args.out:
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": world, "rank": rank, "allreduce": total, "loss": loss.item()}, f)
