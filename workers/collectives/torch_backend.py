"""The job's own torch process group (nccl on GPUs, gloo on CPUs) as a benchmark backend.

torch has no out-of-place all_reduce or broadcast: out-of-place there means copying the input
into the output buffer and running the in-place call, and the copy is part of the time.
In-place all_gather and reduce_scatter pass a view of the output (input) buffer, as nccl-tests does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist


class Communicator(Protocol):
    """Four collectives over float tensors; `send is recv` (or a view of it) means in place."""

    name: str
    device: torch.device

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor) -> None: ...
    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None: ...
    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor) -> None: ...
    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> None: ...
    def synchronize(self) -> None: ...


def _pick(*names: str) -> Callable[..., Any]:
    """The newest spelling torch offers (2.13 renamed the *_into_tensor / *_tensor calls)."""
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return fn
    raise RuntimeError(f"torch.distributed has none of {names}")


_all_gather = _pick("all_gather_single", "all_gather_into_tensor")
_reduce_scatter = _pick("reduce_scatter_single", "reduce_scatter_tensor")


class TorchGroup:
    """The default process group Ray Train set up for the job."""

    def __init__(self, device: torch.device):
        self.name = str(dist.get_backend())
        self.device = device
        self.rank = dist.get_rank()

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        if recv is not send:
            recv.copy_(send)
        dist.all_reduce(recv)

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _all_gather(recv, send)

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        _reduce_scatter(recv, send)

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int) -> None:
        if self.rank == root and recv is not send:
            recv.copy_(send)
        dist.broadcast(recv, src=root)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def group_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum small per-rank numbers (times, error counts) over the job's process group."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


def share_from_rank0(value: Any, device: torch.device) -> Any:
    """Rank 0's `value` on every rank (a small picklable object), over the job's process group."""
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, device=device)
    return box[0]
