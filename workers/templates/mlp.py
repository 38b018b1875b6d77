"""builtin:mlp — a classifier on a synthetic dataset, data-parallel with DDP.

`prepare_data_loader` shards the data across workers, `prepare_model` wraps the model in DDP; a
checkpoint is reported every epoch and a rerun resumes after the last one.

Config: epochs (5), samples (4096), features (32), classes (4), hidden (64), batch_size (64),
lr (0.05), seed (0), epoch_sleep_s (0: stretch epochs for demos and tests), ledger_path, progress_path,
fail_at_epoch / fail_on_attempt (fault injection). When the job is preempted
(`trainmaster.should_checkpoint()`), every rank checkpoints at the current batch and waits to be
stopped; the resumed run continues at that batch, so it trains exactly the steps of an unpreempted run.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainmaster
from workers.templates.common import append_ledger, append_progress, maybe_fail, report, resume


def synthetic_dataset(samples: int, features: int, classes: int, seed: int) -> TensorDataset:
    """Points labelled by a fixed random linear teacher: learnable, identical on every worker."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    labels = (inputs @ teacher).argmax(dim=1)
    return TensorDataset(inputs, labels)


def make_model(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def asked_to_checkpoint() -> bool:
    """`trainmaster.should_checkpoint()` agreed by every rank (one tiny all-reduce), so all of them
    report the same checkpoint at the same step."""
    import torch.distributed as dist

    asked = torch.tensor([1.0 if trainmaster.should_checkpoint() else 0.0])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
    return bool(asked.item())


def wait_to_be_stopped(limit_s: float = 300.0) -> None:
    """After a preemption checkpoint, train no further: the platform stops the job shortly."""
    deadline = time.monotonic() + limit_s
    while trainmaster.should_checkpoint() and time.monotonic() < deadline:
        time.sleep(0.2)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    epochs = int(config.get("epochs", 5))
    features, classes = int(config.get("features", 32)), int(config.get("classes", 4))
    dataset = synthetic_dataset(int(config.get("samples", 4096)), features, classes, int(config.get("seed", 0)))
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(dataset, batch_size=int(config.get("batch_size", 64)), shuffle=True)
    )
    model = make_model(features, int(config.get("hidden", 64)), classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)), momentum=0.9)

    start_epoch, skip_batches = 0, 0
    state = resume(model, optimizer)
    if state is not None:
        # A preempted run saved mid-epoch (`batch`): it resumes at that very batch; otherwise after the epoch.
        mid_epoch = "batch" in state
        skip_batches = int(state["batch"]) if mid_epoch else 0
        start_epoch = int(state["epoch"]) + (0 if mid_epoch else 1)
        where = f"epoch {state['epoch']}" + (f", batch {skip_batches}" if mid_epoch else "")
        print(f"resumed from the checkpoint of {where}", flush=True)
    model = ray.train.torch.prepare_model(model)
    rank = ray.train.get_context().get_world_rank()
    if rank == 0:
        append_ledger(config.get("ledger_path"), start_epoch=start_epoch)

    loss_fn = nn.CrossEntropyLoss()
    step = start_epoch * len(loader) + skip_batches
    for epoch in range(start_epoch, epochs):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        model.train()
        total, correct, loss_sum, batches = 0, 0, 0.0, 0
        for index, (inputs, labels) in enumerate(loader):
            if epoch == start_epoch and index < skip_batches:
                continue  # done before the preemption
            if asked_to_checkpoint():
                inner_model: nn.Module = getattr(model, "module", model)
                state = {"epoch": epoch, "batch": index, "model": inner_model.state_dict()}
                report({"epoch": epoch, "step": step, "preempted": 1}, {**state, "optimizer": optimizer.state_dict()})
                wait_to_be_stopped()
            optimizer.zero_grad()
            logits = model(inputs)
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
            loss_sum += loss_value
            batches += 1
            step += 1
            trainmaster.log({"loss": loss_value, "epoch": epoch}, step=step)
            correct += int((logits.argmax(dim=1) == labels).sum())
            total += len(labels)
        time.sleep(float(config.get("epoch_sleep_s", 0)))
        maybe_fail(config, epoch)
        metrics = {"epoch": epoch, "loss": loss_sum / max(batches, 1), "accuracy": correct / max(total, 1)}
        inner: nn.Module = getattr(model, "module", model)
        report(metrics, {"epoch": epoch, "model": inner.state_dict(), "optimizer": optimizer.state_dict()})
        append_progress(config.get("progress_path"), rank=rank, epoch=epoch)
        if rank == 0:
            print(f"epoch {epoch}: loss {metrics['loss']:.4f} accuracy {metrics['accuracy']:.3f}", flush=True)
