"""A plain PaddlePaddle data-parallel script, as Paddle's `paddle.distributed` guide writes it.

Alone:        python train.py                (init_parallel_env() does nothing in a world of one)
Distributed:  python -m paddle.distributed.launch train.py, or trainmaster's `framework="paddle"`
              (see ../submit.py), which gives every worker the same collective environment
              (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, ...); gloo on CPUs.
"""

from __future__ import annotations

import argparse
import json
import os

import paddle
import paddle.distributed as dist

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", help="write what this rank saw here")
args = parser.parse_args()

dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
total = paddle.to_tensor([float(rank + 1)])
if world > 1:
    dist.all_reduce(total)  # 1 + 2 + ... + world

paddle.seed(rank)  # each rank draws its own shard of the data
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))
if world > 1:
    model = paddle.DataParallel(model)  # gradients all-reduced across the gang
optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
for step in range(args.steps):
    inputs = paddle.randn([64, 8])
    targets = inputs.sum(axis=1, keepdim=True)
    loss = paddle.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
    trainmaster.log({"loss": loss.item()}, step=step)
trainmaster.flush()
print(f"rank {rank}/{world}: all-reduce of rank+1 = {total.item()}, loss {loss.item():.4f}", flush=True)
if args.out:
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"world_size": world, "rank": rank, "allreduce": total.item(), "loss": loss.item()}, f)
