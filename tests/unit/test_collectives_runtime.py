"""builtin:collectives on local processes: the gRPC reduction server, the measured rows on a real
2-rank gloo group, the collective-timeout error text and the NVML link labels."""

from __future__ import annotations

import os
import threading
import types
from datetime import datetime, timezone
from typing import Any

import pytest
import torch

from trainmaster.collectives import MODES, OPS, element_count, rows_from_points
from trainmaster.models import MetricValue
from trainmaster.ports import free_port
from workers.collectives import timeout
from workers.collectives.grpc_backend import GrpcCommunicator, ReductionServer, combine
from workers.collectives.measure import expected_output, fill_inputs, make_buffers, run_op
from workers.collectives.topology import _label

CPU = torch.device("cpu")


def floats(*values: float) -> bytes:
    return torch.tensor(values, dtype=torch.float32).numpy().tobytes()


def test_combine_reduces_gathers_and_broadcasts() -> None:
    parts = {0: floats(1, 2, 3, 4), 1: floats(10, 20, 30, 40)}
    assert combine("all_reduce", parts, 2) == [floats(11, 22, 33, 44)] * 2
    assert combine("reduce_scatter", parts, 2) == [floats(11, 22), floats(33, 44)]
    assert combine("all_gather", parts, 2) == [floats(1, 2, 3, 4, 10, 20, 30, 40)] * 2
    assert combine("broadcast", {0: floats(7), 1: b""}, 2) == [b"", floats(7)]
    with pytest.raises(ValueError):
        combine("all_to_all", parts, 2)


@pytest.mark.parametrize("world_size", [1, 3])
def test_grpc_baseline_gives_every_rank_the_right_answer(world_size: int) -> None:
    server = ReductionServer(world_size, host="127.0.0.1", timeout_s=30).start()
    wrong: dict[tuple[int, str, str], int] = {}

    def rank_main(rank: int) -> None:
        comm = GrpcCommunicator(f"127.0.0.1:{server.port}", rank, CPU, timeout_s=30)
        try:
            for op in OPS:
                for mode in MODES:
                    count = element_count(op, 1000, world_size)
                    buffers = make_buffers(op, mode, count, rank, world_size, CPU)
                    buffers.recv.fill_(float("nan"))
                    fill_inputs(op, buffers, rank)
                    run_op(comm, op, buffers)
                    expected = expected_output(op, count, rank, world_size, CPU)
                    wrong[(rank, op, mode)] = int((buffers.recv != expected).sum())
        finally:
            comm.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    server.stop()
    assert len(wrong) == world_size * len(OPS) * len(MODES)
    assert set(wrong.values()) == {0}, wrong


def _gloo_rank(rank: int, world_size: int, port: int, results: Any) -> None:
    import torch.distributed as dist

    import trainmaster
    from trainmaster.collectives import BenchConfig
    from workers.collectives import job

    logged: list[tuple[int | None, dict[str, float]]] = []
    trainmaster.log = lambda values, step=None: logged.append((step, values))  # type: ignore[assignment]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    bench = BenchConfig(warmup=1, iters=2, max_size=4096)
    rows = []
    for backend in bench.backends:
        with job.open_backend(backend, bench, CPU) as comm:
            rows += job.run_backend(comm, bench, rank, world_size, first_step=len(rows))
    results.put((rank, rows, logged))
    dist.destroy_process_group()


def test_two_gloo_ranks_measure_every_row_correctly() -> None:
    """The job's loop without Ray: the torch group and the gRPC baseline, both ranks agreeing,
    rank 0 logging one point per row that the CLI decodes back into the same rows."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_gloo_rank, args=(r, 2, port, results)) for r in range(2)]
    for process in processes:
        process.start()
    try:
        # Read before joining: the two ranks' results together are about the size of a pipe's buffer
        # (64 KiB), and a rank cannot exit until what it put has been read.
        by_rank = {rank: (rows, logged) for rank, rows, logged in (results.get(timeout=180) for _ in range(2))}
        for process in processes:
            process.join(60)
    finally:
        for process in processes:  # a rank left hanging would hold pytest at exit (it joins its children)
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in processes] == [0, 0]
    rows, logged = by_rank[0]
    assert rows == by_rank[1][0]  # every rank computes the same averaged row
    assert by_rank[1][1] == []  # only rank 0 logs
    assert len(rows) == 2 * 4 * 10 * 2  # backends x ops x sizes (8 B..4 KiB) x modes
    assert {row.backend for row in rows} == {"gloo", "grpc"}
    assert all(row.wrong == 0 and row.time_us > 0 for row in rows)
    assert [step for step, _ in logged] == list(range(len(rows)))
    now = datetime.now(timezone.utc)
    points = [
        MetricValue(seq=1, step=step, rank=0, name=name, value=value, ts=now)
        for step, values in logged
        for name, value in values.items()
    ]
    decoded = rows_from_points(points)
    assert [(d.backend, d.op, d.mode, d.size_bytes, d.time_us) for d in decoded] == [
        (r.backend, r.op, r.mode, r.size_bytes, r.time_us) for r in rows
    ]


NCCL_WATCHDOG = (
    "DistBackendError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
    "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=60000) ran for 60091 milliseconds before timing out."
)
GLOO_RECV = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv operation"


@pytest.mark.parametrize("error", [NCCL_WATCHDOG, GLOO_RECV, "NCCLHangError: Training failed: NCCL RAS found a hang"])
def test_a_collective_timeout_is_named_in_the_job_error(error: str) -> None:
    explained = timeout.explain_failure(error, 60)
    assert explained.startswith("collective timeout: a collective operation did not finish within 60 s")
    assert "TRAINMASTER_COLLECTIVE_TIMEOUT_S" in explained and explained.endswith(error)


def test_the_timeout_found_in_the_full_error_text() -> None:
    one_line = "WorkerGroupError: Training failed due to worker errors"
    explained = timeout.explain_failure(one_line, 1800, full_text=f"[Rank 0 Error Snippet]:\n{NCCL_WATCHDOG}\n")
    assert explained.startswith("collective timeout:") and explained.endswith(one_line)


def test_other_errors_are_left_alone_and_an_abort_gets_a_hint() -> None:
    assert timeout.explain_failure("ValueError: bad config", 60) == "ValueError: bad config"
    aborted = timeout.explain_failure("ActorDiedError: worker exits unexpectedly by a signal. SIGABRT", 60)
    assert "collective timeout of 60 s" in aborted and aborted.startswith("ActorDiedError")


def test_collective_timeout_setting_from_the_environment() -> None:
    env = timeout.ENV_COLLECTIVE_TIMEOUT_S
    assert timeout.collective_timeout_s({}) == 1800
    assert timeout.collective_timeout_s({env: "90.4"}) == 90
    assert timeout.collective_timeout_s({env: "0.1"}) == 1
    assert timeout.collective_timeout_s({env: "soon"}) == 1800


def test_driver_and_dispatcher_carry_the_collective_timeout() -> None:
    from api.settings import Settings

    assert Settings().collective_timeout_s == 1800.0
    from workers import driver

    assert "collective timeout" in driver._root_cause(RuntimeError(NCCL_WATCHDOG))


def test_nvml_labels_direct_links_switches_and_pci() -> None:
    fake = types.SimpleNamespace(nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 40)
    buses = ["gpu0", "gpu1", "gpu2"]
    direct = [{"gpu1": 4}, {"gpu0": 4}, {}]
    assert _label(fake, [0, 1, 2], direct, buses, 0, 0) == "X"
    assert _label(fake, [0, 1, 2], direct, buses, 0, 1) == "NV4"
    assert _label(fake, [0, 1, 2], direct, buses, 0, 2) == "NODE"
    switched = [{"switch0": 9, "switch1": 9}, {"switch0": 9, "switch1": 9}, {}]
    assert _label(fake, [0, 1, 2], switched, buses, 1, 0) == "NV18"
