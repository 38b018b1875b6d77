"""A plain PyTorch training script: runs alone on a laptop, or distributed with no code change.

Alone:        python examples/script_mode/train.py --epochs 3
Distributed:  trainmaster submits it in script mode (see submit.py beside it); every worker runs this
              file with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), so the same
              `init_process_group()` that torchrun scripts use just works.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    distributed = "RANK" in os.environ  # set by torchrun, or by trainmaster's script mode
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(2048, 16, generator=generator)
    labels = (inputs.sum(dim=1) > 0).long()
    dataset = TensorDataset(inputs, labels)
    sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, shuffle=sampler is None)

    model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch, target in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(batch), target)
            loss.backward()
            optimizer.step()
            step += 1
            trainmaster.log({"loss": loss.item()}, step=step)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)

    trainmaster.flush()
    if distributed:
        dist.destroy_process_group()
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
