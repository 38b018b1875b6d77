"""One row of the benchmark on one rank: buffers, warm-up, timed iterations, correctness check.

Every rank's input is (i mod 13) + rank + 1 at element i: small integers, so float32 sums are
exact and a result is either right or wrong. The check runs after timing on fresh inputs and an
output poisoned with NaN, so a stale result from the timed runs cannot pass for a correct one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workers.collectives.torch_backend import Communicator

ROOT = 0


def pattern(length: int, rank: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    index = torch.arange(offset, offset + length, device=device)
    return ((index % 13) + rank + 1).to(torch.float32)


def expected_output(op: str, count: int, rank: int, world_size: int, device: torch.device) -> torch.Tensor:
    """What `rank` must hold after `op` on `count` elements (the row's count, as in nccl-tests)."""
    n = world_size
    if op == "broadcast":
        return pattern(count, ROOT, device)
    if op == "all_gather":
        chunk = count // n
        return torch.cat([pattern(chunk, r, device) for r in range(n)])
    summed = ((torch.arange(count, device=device) % 13) * n + n * (n + 1) / 2).to(torch.float32)
    if op == "reduce_scatter":
        chunk = count // n
        return summed[rank * chunk : (rank + 1) * chunk]
    return summed


@dataclass
class Buffers:
    send: torch.Tensor
    recv: torch.Tensor  # the output this rank checks; a view of `send` (or the reverse) in place


def make_buffers(op: str, mode: str, count: int, rank: int, world_size: int, device: torch.device) -> Buffers:
    in_place = mode == "in"
    if op in ("all_reduce", "broadcast"):
        send = torch.empty(count, dtype=torch.float32, device=device)
        return Buffers(send, send if in_place else torch.empty_like(send))
    chunk = count // world_size
    own = slice(rank * chunk, (rank + 1) * chunk)
    if op == "all_gather":
        recv = torch.empty(count, dtype=torch.float32, device=device)
        return Buffers(recv[own] if in_place else torch.empty(chunk, dtype=torch.float32, device=device), recv)
    if op == "reduce_scatter":
        send = torch.empty(count, dtype=torch.float32, device=device)
        return Buffers(send, send[own] if in_place else torch.empty(chunk, dtype=torch.float32, device=device))
    raise ValueError(f"unknown collective {op!r}")


def run_op(comm: Communicator, op: str, buffers: Buffers) -> None:
    if op == "broadcast":
        comm.broadcast(buffers.send, buffers.recv, ROOT)
    else:
        getattr(comm, op)(buffers.send, buffers.recv)


def fill_inputs(op: str, buffers: Buffers, rank: int) -> None:
    buffers.send.copy_(pattern(buffers.send.numel(), rank, buffers.send.device))


def measure(
    comm: Communicator, op: str, mode: str, count: int, *, rank: int, world_size: int, warmup: int, iters: int
) -> tuple[float, int]:
    """(microseconds per call on this rank, wrong elements in this rank's output)."""
    buffers = make_buffers(op, mode, count, rank, world_size, comm.device)
    fill_inputs(op, buffers, rank)
    for _ in range(warmup):
        run_op(comm, op, buffers)
    comm.synchronize()
    dist.barrier()  # start the clock together, as nccl-tests does
    started = time.perf_counter()
    for _ in range(iters):
        run_op(comm, op, buffers)
    comm.synchronize()
    elapsed = time.perf_counter() - started
    buffers.recv.fill_(float("nan"))
    fill_inputs(op, buffers, rank)
    run_op(comm, op, buffers)
    comm.synchronize()
    wrong = int((buffers.recv != expected_output(op, count, rank, world_size, comm.device)).sum())
    return elapsed / max(iters, 1) * 1e6, wrong
