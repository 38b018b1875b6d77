"""Function mode: a `train_loop_per_worker(config)` with Ray Train's helpers.

`prepare_data_loader` shards the data across workers (and moves batches to the device),
`prepare_model` wraps the model in DistributedDataParallel on the right device.
"""

from __future__ import annotations

from typing import Any

import ray.train
import ray.train.torch
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainmaster


def train_loop_per_worker(config: dict[str, Any]) -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(1024, 8, generator=generator)
    targets = inputs @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(1024, generator=generator)
    loader = ray.train.torch.prepare_data_loader(DataLoader(TensorDataset(inputs, targets), batch_size=32))
    model = ray.train.torch.prepare_model(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.01))

    step = 0
    for epoch in range(config.get("epochs", 3)):
        for batch, target in loader:
            loss = nn.functional.mse_loss(model(batch).squeeze(-1), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            trainmaster.log({"mse": loss.item()}, step=step)
        ray.train.report({"epoch": epoch, "mse": loss.item()})  # once an epoch: it waits for every worker
