"""builtin:collectives through the whole stack: real TorchTrainer workers, the gRPC baseline, the CLI.

Two jobs at most here (a TorchTrainer start costs 20-30 s on a 2-core machine), small sizes and few
iterations; the GPU test runs only where CUDA is.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import trainmaster as tm
from tests.e2e.conftest import REPO, TRAINMASTER, Stack
from trainmaster import collectives as plan

pytestmark = pytest.mark.ray

SMALL = {"max_size": 64 * 1024, "warmup": 1, "iters": 3}


def assert_consistent(rows: list[plan.PointRow], world_size: int) -> None:
    """#wrong 0, and algbw/busbw exactly what size, time and the rank count say (nccl-tests)."""
    for row in rows:
        assert row.wrong == 0, row
        assert row.time_us > 0, row
        algbw = row.size_bytes / (row.time_us * 1e-6) / 1e9
        assert row.algbw == pytest.approx(algbw, rel=1e-6), row
        assert row.busbw == pytest.approx(algbw * plan.bus_factor(row.op, world_size), rel=1e-6, abs=1e-12), row
        assert row.size_bytes == row.count * 4, row


def test_two_gloo_workers_measure_every_collective_and_grpc_agrees(stack: Stack) -> None:
    with stack.client() as client:
        job = client.submit(
            name="collectives-gloo-2",
            entrypoint="builtin:collectives",
            scaling=tm.Scaling(num_workers=2),
            config={"backends": ["torch", "grpc"], **SMALL},
        )
        done = client.wait(job.id, timeout=300, poll_interval=0.5)
        assert done.status is tm.JobStatus.succeeded, done.error
        rows = plan.rows_from_points(client.metrics(job.id))
        events = client.events(job.id)

    sizes = plan.doubling_sizes(8, 64 * 1024)
    assert len(rows) == 2 * len(plan.OPS) * len(sizes) * 2
    assert [row.step for row in rows] == list(range(len(rows)))
    assert {(row.backend, row.op, row.mode) for row in rows} == {
        (backend, op, mode) for backend in ("gloo", "grpc") for op in plan.OPS for mode in plan.MODES
    }
    assert_consistent(rows, 2)
    grpc = [row for row in rows if row.backend == "grpc"]
    assert {row.op for row in grpc} == set(plan.OPS) and all(row.wrong == 0 for row in grpc)

    topology = sorted((e.data for e in events if e.kind == "topology"), key=lambda d: d["rank"])
    assert [d["rank"] for d in topology] == [0, 1]
    assert all(d["node_id"] and d["node_ip"] and d["device"] == "cpu" for d in topology)
    plans = [e.data for e in events if e.kind == "collectives_plan"]
    assert len(plans) == 1 and plans[0]["rows"] == len(rows) and plans[0]["world_size"] == 2
    parts = [e.data for e in events if e.kind == "collectives_result"]
    table = plan.rows_from_events(parts)
    assert [(r.backend, r.op, r.mode, r.size_bytes, r.wrong) for r in table] == [
        (r.backend, r.op, r.mode, r.size_bytes, r.wrong) for r in rows
    ]
    summary = next(p["summary"] for p in parts if "summary" in p)
    assert summary["wrong"] == 0 and set(summary["avg_busbw"]) == {"gloo", "grpc"}


def test_cli_bench_collectives_prints_json_rows(stack: Stack) -> None:
    env = {**os.environ, "TRAINMASTER_API_URL": stack.api.url, "TRAINMASTER_TOKEN": stack.api.token}
    command = [TRAINMASTER, "bench", "collectives", "--workers", "2", "--max-size", "64K"]
    command += ["--iters", "3", "--warmup", "1", "--json"]
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    rows = [plan.PointRow(**row) for row in data["rows"]]
    assert len(rows) == 2 * 4 * 14 * 2 and data["wrong"] == 0 and data["world_size"] == 2
    assert_consistent(rows, 2)
    assert set(data["avg_busbw"]) == {"gloo", "grpc"}
    assert len(data["ratios"]) == 4 * 14 * 2
    assert {r["backends"] for r in data["ratios"]} == {"gloo/grpc"} and all(r["ratio"] > 0 for r in data["ratios"])


def test_nccl_on_one_gpu(stack: Stack) -> None:
    """World size 1: NCCL refuses two ranks on one GPU. busbw is 0 for all_reduce at n = 1 by definition."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with stack.client() as client:
        job = client.submit(
            name="collectives-nccl-1",
            entrypoint="builtin:collectives",
            scaling=tm.Scaling(num_workers=1, use_gpu=True),
            backend="nccl",
            config={"backends": ["nccl", "grpc"], "max_size": 16 * 1024 * 1024, "warmup": 2, "iters": 5},
        )
        done = client.wait(job.id, timeout=300, poll_interval=0.5)
        assert done.status is tm.JobStatus.succeeded, done.error
        rows = plan.rows_from_points(client.metrics(job.id))
        topology = [e.data for e in client.events(job.id) if e.kind == "topology"]
    assert {row.backend for row in rows} == {"nccl", "grpc"}
    assert_consistent(rows, 1)
    assert topology and topology[0]["device"].startswith("cuda") and topology[0]["gpu_name"]
    print(f"\n{len(rows)} rows; nccl vs grpc at 16M:")
    for row in rows:
        if row.size_bytes >= 16 * 1024 * 1024 - 64:
            print(f"  {row.backend:5} {row.op:15} {row.mode:3} {row.time_us:10.1f} us  busbw {row.busbw:8.3f} GB/s")
