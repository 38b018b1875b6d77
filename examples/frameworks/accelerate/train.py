"""A plain Hugging Face Accelerate script, as Accelerate's docs write it.

Alone:        python train.py                (one process)
Distributed:  accelerate launch / torchrun --nproc-per-node 2 train.py, or trainmaster's script
              mode (see ../submit.py): every worker runs this file with torchrun's environment, which
              `Accelerator()` reads (gloo on CPUs). framework stays "torch".
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", help="write what this rank saw here")
    args = parser.parse_args()

    accelerator = Accelerator()
    inputs = torch.randn(512, 4, generator=torch.Generator().manual_seed(0))
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    while step < args.steps:
        for batch, target in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(batch), target)
            accelerator.backward(loss)
            optimizer.step()
            trainmaster.log({"loss": loss.item()}, step=step)
            step += 1
            if step == args.steps:
                break

    rank, world = accelerator.process_index, accelerator.num_processes
    total = accelerator.reduce(torch.tensor(float(rank + 1)), reduction="sum").item()
    trainmaster.flush()
    accelerator.print(f"{world} process(es): all-reduce of rank+1 = {total}, loss {loss.item():.4f}")
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"world_size": world, "rank": rank, "allreduce": total, "loss": loss.item()}, f)
    accelerator.end_training()


if __name__ == "__main__":
    main()
