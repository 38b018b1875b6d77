"""A plain mpi4py program: linear regression whose gradients are averaged with MPI's all-reduce.

Alone:        python train.py                (a world of one)
Distributed:  mpirun -np 4 python train.py, or trainmaster's `framework="mpi"` (see ../submit.py),
              which runs mpirun across the job's gang with a hostfile built from its nodes.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from mpi4py import MPI

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", help="write what this rank saw here")
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(float(rank + 1), op=MPI.SUM)  # 1 + 2 + ... + world

rng = np.random.default_rng(rank)  # each rank holds its own shard of the data
inputs = rng.normal(size=(256, 4))
targets = inputs @ np.array([1.0, -2.0, 0.5, 3.0])
weights = np.zeros(4)
for step in range(args.steps):
    error = inputs @ weights - targets
    gradient = np.empty(4)
    comm.Allreduce(inputs.T @ error / len(inputs), gradient, op=MPI.SUM)
    weights -= 0.1 * gradient / world
    loss = comm.allreduce(float(np.mean(error**2)), op=MPI.SUM) / world
    trainmaster.log({"loss": loss}, step=step)
trainmaster.flush()
print(f"rank {rank}/{world}: all-reduce of rank+1 = {total}, loss {loss:.4f}", flush=True)
if args.out:
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": world, "rank": rank, "allreduce": total, "loss": loss}, f)
