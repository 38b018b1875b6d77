"""builtin:collectives — the training function: measure every row, log it, record the table.

Config (all optional): backends (["torch", "grpc"]; "nccl"/"gloo" name the job's process group
too), ops (all four), min_size (8) and max_size (64 MiB) in bytes, warmup (5), iters (20),
grpc_timeout_s (600). Rank 0 logs each row as a metric point (step = row index, see
`trainmaster.collectives.Row.metric_values`), prints it nccl-tests style, and records the whole table as
`collectives_result` events; every rank records a `topology` event.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

import trainmaster
from trainmaster.collectives import (
    DTYPE,
    ELEMENT_BYTES,
    MODES,
    BenchConfig,
    Row,
    average_busbw,
    bandwidths,
    element_count,
    result_events,
)
from trainmaster.context import post_event
from workers.collectives.grpc_backend import GrpcCommunicator, ReductionServer
from workers.collectives.measure import measure
from workers.collectives.topology import describe, worker_topology
from workers.collectives.torch_backend import Communicator, TorchGroup, group_sum, share_from_rank0


def group_device() -> torch.device:
    """CUDA for an nccl group (the device Ray Train gave this worker), the CPU otherwise."""
    import ray.train.torch

    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    device = ray.train.torch.get_device()
    torch.cuda.set_device(device)
    return device


@contextmanager
def open_backend(name: str, bench: BenchConfig, device: torch.device) -> Iterator[Communicator]:
    if name == "torch":
        yield TorchGroup(device)
        return
    import ray.util

    rank, world_size = dist.get_rank(), dist.get_world_size()
    server = ReductionServer(world_size, timeout_s=bench.grpc_timeout_s).start() if rank == 0 else None
    address = share_from_rank0(f"{ray.util.get_node_ip_address()}:{server.port}" if server else None, device)
    client = GrpcCommunicator(address, rank, device, timeout_s=bench.grpc_timeout_s)
    try:
        yield client
    finally:
        client.close()
        dist.barrier()  # nobody stops the server while another rank still waits on it
        if server is not None:
            server.stop()


def header(backend: str, op: str, world_size: int) -> str:
    return (
        f"# {op} on {world_size} rank(s) over {backend}\n"
        f"# {'size':>12} {'count':>12} {'type':>6}   out: {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        f"   in: {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}\n"
        f"# {'(B)':>12} {'(elements)':>12} {'':>6}        {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}"
    )


def line(pair: list[Row]) -> str:
    first = pair[0]
    cells = "".join(f"   {r.mode}: {r.time_us:9.1f} {r.algbw:7.3f} {r.busbw:7.3f} {r.wrong:6d}" for r in pair)
    return f"  {first.size_bytes:12d} {first.count:12d} {DTYPE:>6}{cells}"


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    bench = BenchConfig.from_config(config)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = group_device()
    where = worker_topology(rank, context.get_local_rank(), context.get_node_rank())
    post_event("topology", describe(where), where)
    if rank == 0:
        plan = {
            "world_size": world_size,
            "backends": list(bench.backends),
            "ops": list(bench.ops),
            "sizes": bench.sizes(),
            "rows": bench.total_rows(),
            "warmup": bench.warmup,
            "iters": bench.iters,
            "dtype": DTYPE,
        }
        post_event("collectives_plan", f"{plan['rows']} rows on {world_size} rank(s)", plan)
    rows: list[Row] = []
    for backend in bench.backends:
        with open_backend(backend, bench, device) as comm:
            rows += run_backend(comm, bench, rank, world_size, first_step=len(rows))
    if rank == 0:
        report_table(rows, world_size, bench)


def run_backend(comm: Communicator, bench: BenchConfig, rank: int, world_size: int, first_step: int) -> list[Row]:
    """Every op, size and mode on one backend; row i is logged at step first_step + i."""
    rows: list[Row] = []
    for op in bench.ops:
        if rank == 0:
            print(header(comm.name, op, world_size), flush=True)
        for size in bench.sizes():
            for mode in MODES:
                rows.append(measure_row(comm, op, mode, size, rank, world_size, bench, first_step + len(rows)))
            if rank == 0:
                print(line(rows[-len(MODES) :]), flush=True)
    return rows


def measure_row(
    comm: Communicator, op: str, mode: str, size: int, rank: int, world_size: int, bench: BenchConfig, step: int
) -> Row:
    """Measure on every rank, average the time over ranks, add up wrong elements; rank 0 logs."""
    count = element_count(op, size, world_size)
    time_us, wrong = measure(
        comm, op, mode, count, rank=rank, world_size=world_size, warmup=bench.warmup, iters=bench.iters
    )
    total_time, total_wrong = group_sum([time_us, float(wrong)], comm.device)
    mean_time = total_time / world_size
    size_bytes = count * ELEMENT_BYTES
    algbw, busbw = bandwidths(op, size_bytes, mean_time, world_size)
    row = Row(comm.name, op, mode, size_bytes, count, mean_time, algbw, busbw, int(total_wrong))
    if rank == 0:
        trainmaster.log(row.metric_values(), step=step)
    return row


def report_table(rows: list[Row], world_size: int, bench: BenchConfig) -> None:
    averages = average_busbw(rows)
    for backend, per_op in averages.items():
        print(f"# {backend}: avg bus bandwidth {per_op['all']:.3f} GB/s", flush=True)
    wrong = sum(row.wrong for row in rows)
    summary = {
        "world_size": world_size,
        "rows": len(rows),
        "wrong": wrong,
        "avg_busbw": averages,
        "warmup": bench.warmup,
        "iters": bench.iters,
    }
    parts = result_events(rows, summary)
    for data in parts:
        message = f"{len(rows)} rows, {wrong} wrong elements (part {data['part']}/{data['parts']})"
        post_event("collectives_result", message, data)
