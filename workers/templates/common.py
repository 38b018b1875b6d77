"""Helpers the built-in templates share: checkpoints with resume, a launch ledger."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from trainmaster.context import JobContext


def resume(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """Load `model` and `optimizer` from the last reported checkpoint of this run (any earlier attempt);
    return the whole saved state (where the run was), or None when there is no checkpoint yet."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        state: dict[str, Any] = torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state


def report(metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
    """Report metrics from every worker; rank 0 attaches a checkpoint holding `state`."""
    import ray.train

    if state is None or ray.train.get_context().get_world_rank() != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        torch.save(state, Path(folder) / "state.pt")
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def append_ledger(path: str | None, **fields: Any) -> None:
    """One line per launch, written by the training code itself, for counting launches in tests."""
    if not path:
        return
    context = JobContext.from_env()
    job_id, attempt = (context.job_id, context.attempt) if context else ("-", "-")
    extra = " ".join(f"{k}={v}" for k, v in fields.items())
    with open(path, "a") as ledger:
        ledger.write(f"{job_id} {attempt} {os.getpid()} {extra}\n")


def append_progress(path: str | None, **fields: Any) -> None:
    """After each checkpoint, every rank notes its pid and epoch (fault tests kill a worker from it)."""
    if not path:
        return
    with open(path, "a") as progress:
        progress.write(" ".join([str(os.getpid()), *(f"{k}={v}" for k, v in fields.items())]) + "\n")


def maybe_fail(config: dict[str, Any], epoch: int) -> None:
    """Fault injection for tests: raise at `fail_at_epoch` on attempt `fail_on_attempt` (default 1)."""
    if config.get("fail_at_epoch") != epoch:
        return
    context = JobContext.from_env()
    if (context.attempt if context else 1) == int(config.get("fail_on_attempt", 1)):
        raise RuntimeError(f"injected failure at epoch {epoch}")
