"""builtin:collectives without processes: nccl-tests bandwidth math, sizes, row encoding, events."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from trainmaster import collectives as plan
from trainmaster.cli import bench
from trainmaster.collectives import BenchConfig, Row
from trainmaster.models import JobEventIn, JobSpec, MetricValue


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),  # 2(n-1)/n
        ("all_reduce", 1, 0.0),
        ("all_gather", 4, 0.75),  # (n-1)/n
        ("reduce_scatter", 8, 0.875),
        ("broadcast", 8, 1.0),
        ("broadcast", 1, 1.0),
    ],
)
def test_bus_factor_follows_nccl_tests(op: str, n: int, factor: float) -> None:
    assert plan.bus_factor(op, n) == pytest.approx(factor)


def test_bandwidths_are_gb_per_second_of_the_row_size() -> None:
    # 64 MiB all_reduce in 10 ms on 4 ranks: algbw = 67108864 B / 0.01 s / 1e9 = 6.7108864 GB/s
    algbw, busbw = plan.bandwidths("all_reduce", 64 * 1024 * 1024, 10_000.0, 4)
    assert algbw == pytest.approx(6.7108864)
    assert busbw == pytest.approx(6.7108864 * 1.5)
    assert plan.bandwidths("broadcast", 1024, 0.0, 2) == (0.0, 0.0)
    with pytest.raises(ValueError, match="unknown collective"):
        plan.bus_factor("all_to_all", 2)


def test_sizes_double_from_8_bytes_to_the_maximum_inclusive() -> None:
    assert plan.doubling_sizes(8, 64) == [8, 16, 32, 64]
    assert plan.doubling_sizes(8, 100) == [8, 16, 32, 64]
    assert len(plan.doubling_sizes(8, 64 * 1024 * 1024)) == 24
    with pytest.raises(ValueError):
        plan.doubling_sizes(16, 8)


def test_element_counts_split_evenly_across_ranks() -> None:
    assert plan.element_count("all_reduce", 8, 3) == 2
    assert plan.element_count("all_gather", 8, 3) == 3  # one element per rank at least
    assert plan.element_count("reduce_scatter", 1024, 3) == 255  # 256 rounded down to 3 x 85
    assert plan.element_count("broadcast", 4, 2) == 1


@pytest.mark.parametrize(
    ("text", "size"),
    [("8", 8), ("8B", 8), ("64K", 65536), ("64KiB", 65536), ("64kb", 65536), ("16M", 16 << 20), ("1G", 1 << 30)],
)
def test_parse_size(text: str, size: int) -> None:
    assert bench.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "1.5M", "64P", "-8"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        bench.parse_size(text)


def test_format_size() -> None:
    assert [bench.format_size(s) for s in (8, 1024, 3000, 1 << 20, 64 << 20, 1 << 30)] == [
        "8B",
        "1K",
        "3000B",
        "1M",
        "64M",
        "1G",
    ]


def sample_rows() -> list[Row]:
    rows = []
    for backend, slowdown in (("gloo", 1.0), ("grpc", 4.0)):
        for op in ("all_reduce", "broadcast"):
            for size in (8, 1 << 20):
                for mode in plan.MODES:
                    time_us = 100.0 * slowdown * (1 + size / 65536)
                    algbw, busbw = plan.bandwidths(op, size, time_us, 2)
                    rows.append(Row(backend, op, mode, size, size // 4, time_us, algbw, busbw, 0))
    return rows


def as_points(rows: list[Row]) -> list[MetricValue]:
    now = datetime.now(timezone.utc)
    points = []
    for step, row in enumerate(rows):
        for name, value in row.metric_values().items():
            points.append(MetricValue(seq=len(points) + 1, step=step, rank=0, name=name, value=value, ts=now))
    return points


def test_cli_decodes_the_rows_the_job_logs() -> None:
    rows = sample_rows()
    points = as_points(rows)
    assert points[0].name == "coll/gloo/all_reduce/out/size_bytes"
    noise = MetricValue(seq=0, step=0, rank=0, name="report/loss", value=1.0, ts=points[0].ts)
    other_rank = points[0].model_copy(update={"rank": 1, "value": 999.0})
    decoded = plan.rows_from_points([noise, other_rank, *reversed(points)])
    assert [(d.backend, d.op, d.mode, d.size_bytes, d.count, d.time_us, d.busbw, d.wrong) for d in decoded] == [
        (r.backend, r.op, r.mode, r.size_bytes, r.count, r.time_us, r.busbw, r.wrong) for r in rows
    ]
    assert [d.step for d in decoded] == list(range(len(rows)))


def test_a_row_missing_a_field_is_left_out() -> None:
    points = [p for p in as_points(sample_rows()[:2]) if not (p.step == 1 and p.name.endswith("/wrong"))]
    assert [row.step for row in plan.rows_from_points(points)] == [0]


def test_ratio_and_average_busbw() -> None:
    decoded = plan.rows_from_points(as_points(sample_rows()))
    found = bench.ratios(decoded)
    assert len(found) == 8  # 2 ops x 2 sizes x 2 modes
    assert {r["backends"] for r in found} == {"gloo/grpc"}
    assert all(r["ratio"] == pytest.approx(4.0) for r in found)
    averages = plan.average_busbw(decoded)
    assert averages["gloo"]["all"] == pytest.approx(4 * averages["grpc"]["all"])
    assert set(averages["gloo"]) == {"all_reduce", "broadcast", "all"}
    for backend, per_op in plan.average_busbw(sample_rows()).items():
        assert per_op == pytest.approx(averages[backend])


def test_the_cli_prints_tables_from_decoded_rows() -> None:
    from rich.console import Console

    console = Console(record=True, width=200)
    bench.print_tables(plan.rows_from_points(as_points(sample_rows())), 2, console)
    text = console.export_text()
    assert "all_reduce · gloo · 2 rank(s)" in text and "gloo/grpc out" in text and "4.00x" in text
    assert "#wrong total: 0" in text


def test_result_events_fit_the_api_limit_and_round_trip() -> None:
    rows = sample_rows() * 40  # 640 rows: several parts
    summary = {"world_size": 2, "avg_busbw": plan.average_busbw(rows)}
    parts = plan.result_events(rows, summary)
    assert len(parts) > 1
    assert [p["part"] for p in parts] == list(range(1, len(parts) + 1))
    assert {p["parts"] for p in parts} == {len(parts)}
    for data in parts:
        JobEventIn(kind="collectives_result", data={"attempt": 1, **data})  # the API's own 16 KiB check
        assert len(json.dumps(data)) <= 16 * 1024
    rebuilt = plan.rows_from_events(reversed(parts))
    assert [(r.op, r.size_bytes, r.wrong) for r in rebuilt] == [(r.op, r.size_bytes, r.wrong) for r in rows]
    assert rebuilt[0].time_us == pytest.approx(rows[0].time_us)


def test_bench_config_defaults_and_validation() -> None:
    default = BenchConfig.from_config({})
    assert default.backends == ("torch", "grpc") and default.max_size == 64 * 1024 * 1024
    assert default.total_rows() == 2 * 4 * 24 * 2
    assert BenchConfig.from_config({"backends": ["gloo", "torch", "grpc"]}).backends == ("torch", "grpc")
    for bad in ({"backends": ["mpi"]}, {"ops": ["all_to_all"]}, {"iters": 0}, {"max_size": 4}, {"colour": 1}):
        with pytest.raises(ValueError):
            BenchConfig.from_config(bad)


def test_cli_builds_a_valid_job_spec() -> None:
    body = bench.job_body(2, ["torch", "grpc"], list(bench.OPS), "8", "64K", False, 3, 1)
    spec = JobSpec.model_validate(body)
    assert spec.entrypoint == "builtin:collectives" and spec.scaling.num_workers == 2
    assert spec.config["max_size"] == 65536 and spec.config["iters"] == 3
    assert BenchConfig.from_config(spec.config).total_rows() == 2 * 4 * 14 * 2
    gpu = JobSpec.model_validate(bench.job_body(1, ["nccl"], ["all_reduce"], "8", "1M", False, 5, 1))
    assert gpu.scaling.use_gpu and gpu.backend == "nccl"
    with pytest.raises(ValueError, match="choose one"):
        bench.job_body(2, ["nccl", "gloo"], ["all_reduce"], "8", "1M", False, 5, 1)
    with pytest.raises(ValueError, match="min-size"):
        bench.job_body(2, ["grpc"], ["all_reduce"], "1M", "8", False, 5, 1)
