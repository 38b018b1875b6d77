"""A plain PyTorch Lightning script with `Trainer(strategy="ddp")`, as Lightning's docs write it.

Alone:        python train.py                (one process)
Distributed:  torchrun --nproc-per-node 2 train.py, or trainmaster's script mode (see ../submit.py):
              every worker runs this file with torchrun's environment, which Lightning reads as a
              TorchElastic cluster, so `strategy="ddp"` joins the whole gang. framework stays "torch".
              As with torchrun, `devices` and `num_nodes` must match the launch: give the job the same
              number of workers on every node (STRICT_PACK, or STRICT_SPREAD with one per node).
"""

from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainmaster  # optional: per-step metrics; a no-op when run outside trainmaster


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        self.log("loss", loss)
        trainmaster.log({"loss": loss.item()}, step=self.global_step)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", help="write what this rank saw here")
    args = parser.parse_args()

    inputs = torch.randn(512, 4, generator=torch.Generator().manual_seed(0))
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=32)
    # As under torchrun: devices per node and nodes match how the job was launched (alone: 1 x 1).
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=devices,
        num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // devices,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)
    rank, world = trainer.global_rank, trainer.world_size
    total = trainer.strategy.reduce(torch.tensor(float(rank + 1)), reduce_op="sum").item()
    trainmaster.flush()
    print(f"rank {rank}/{world}: all-reduce of rank+1 = {total}", flush=True)
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"world_size": world, "rank": rank, "allreduce": total}, f)


if __name__ == "__main__":
    main()
