"""`trainmaster bench collectives`: submit builtin:collectives, follow it, print nccl-tests tables.

The job logs one metric point per result row, at step = the row's index, with values named
``coll/<backend>/<op>/<mode>/<field>`` (fields: size_bytes, count, time_us, algbw, busbw, wrong);
`trainmaster.collectives.rows_from_points` rebuilds the rows from those points, whether streamed or read back later.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainmaster.cli.output import console, err_console
from trainmaster.client import Client
from trainmaster.collectives import METRIC_PREFIX, MODES, OPS, PointRow, average_busbw, doubling_sizes, rows_from_points
from trainmaster.errors import TrainmasterError
from trainmaster.models import JobSpec, MetricValue

bench_app = typer.Typer(help="Benchmarks that run as trainmaster jobs.", no_args_is_help=True)

UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'8', '8B', '64K', '64KiB', '1M', '2G', '1T' -> bytes (K, M, G, T are powers of 1024, as in nccl-tests)."""
    match = SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 8, 64K, 16M, 1G, 2T)")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def format_size(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return f"{size}B"


def ratios(rows: list[PointRow]) -> list[dict[str, Any]]:
    """For the first backend against each other one, at each op, mode and size: how many times
    faster the first is (the other's time / the first's time, which is also the busbw ratio)."""
    backends = list(dict.fromkeys(row.backend for row in rows))
    times = {(r.backend, r.op, r.mode, r.size_bytes): r.time_us for r in rows}
    out = []
    for other in backends[1:]:
        for row in rows:
            theirs = times.get((other, row.op, row.mode, row.size_bytes))
            if row.backend == backends[0] and theirs is not None and row.time_us > 0:
                ratio = theirs / row.time_us
                key = {"op": row.op, "mode": row.mode, "size_bytes": row.size_bytes}
                out.append({**key, "backends": f"{backends[0]}/{other}", "ratio": ratio})
    return out


def op_table(rows: list[PointRow], backend: str, op: str, world_size: int) -> Table:
    """One nccl-tests block: a line per size, out-of-place then in-place (time in us, GB/s)."""
    redop, root = ("sum", -1) if op in ("all_reduce", "reduce_scatter") else ("none", 0 if op == "broadcast" else -1)
    title = f"{op} · {backend} · {world_size} rank(s) · float, redop {redop}, root {root} · us and GB/s"
    table = Table(title=title, header_style="bold", box=None, pad_edge=False, collapse_padding=True)
    for name in ("size (B)", "count"):
        table.add_column(name, justify="right", no_wrap=True)
    for mode in ("out", "in"):  # out-of-place, in-place
        for name in (f"{mode} time", "algbw", "busbw", "#wrong"):
            table.add_column(name, justify="right", no_wrap=True)
    by_size: dict[int, dict[str, PointRow]] = {}
    for row in rows:
        if row.backend == backend and row.op == op:
            by_size.setdefault(row.size_bytes, {})[row.mode] = row
    for size, modes in sorted(by_size.items()):
        cells = [str(size), str(next(iter(modes.values())).count)]
        for mode in MODES:
            r = modes.get(mode)
            cells += ["-"] * 4 if r is None else [f"{r.time_us:.1f}", f"{r.algbw:.3f}", f"{r.busbw:.3f}", str(r.wrong)]
        table.add_row(*cells)
    per_op = average_busbw(r for r in rows if r.backend == backend and r.op == op)
    table.caption = f"avg bus bandwidth {per_op[backend][op]:.3f} GB/s" if per_op else None
    return table


def ratio_table(found: list[dict[str, Any]]) -> Table:
    title = "times faster: the other's time / the first's"
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("op")
    table.add_column("size", justify="right")
    columns = list(dict.fromkeys(f"{r['backends']} {r['mode']}" for r in found))
    for column in columns:
        table.add_column(column, justify="right")
    cells: dict[tuple[str, int], dict[str, str]] = {}
    for r in found:
        cells.setdefault((r["op"], r["size_bytes"]), {})[f"{r['backends']} {r['mode']}"] = f"{r['ratio']:.2f}x"
    for (op, size), values in cells.items():
        table.add_row(op, format_size(size), *[values.get(c, "-") for c in columns])
    return table


def follow(client: Client, job_id: str, total: int, out: Console) -> list[PointRow]:
    """Stream the job's metrics with a progress bar until it ends; the rows, read back if needed."""
    points: list[MetricValue] = []
    steps: set[int] = set()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task(f"collectives {job_id[:8]}", total=total)
        for point in client.stream_metrics(job_id):
            if point.name.startswith(f"{METRIC_PREFIX}/") and point.rank == 0:
                points.append(point)
                if point.step is not None:
                    steps.add(point.step)
                    progress.update(task, completed=len(steps))
    rows = rows_from_points(points)
    if len(rows) < total:  # a stream cut short: the stored points are the record
        rows = rows_from_points(client.metrics(job_id))
    return rows


Backends = Annotated[list[str], typer.Option("--backend", "-b", help="torch (nccl/gloo), grpc; repeatable")]


@bench_app.command("collectives")
def collectives(
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="ranks (gang size)")] = 2,
    backend: Backends = [],  # noqa: B006
    op: Annotated[list[str], typer.Option("--op", help="only these collectives, repeatable")] = [],  # noqa: B006
    min_size: Annotated[str, typer.Option(help="smallest message, e.g. 8")] = "8",
    max_size: Annotated[str, typer.Option(help="largest message, e.g. 64M (sizes double)")] = "64M",
    gpu: Annotated[bool, typer.Option("--gpu", help="one GPU per worker (nccl)")] = False,
    iters: Annotated[int, typer.Option(min=1, help="timed iterations per row")] = 20,
    warmup: Annotated[int, typer.Option(min=0, help="warm-up iterations per row")] = 5,
    cpus_per_worker: Annotated[float | None, typer.Option(help="CPUs per worker")] = None,
    timeout: Annotated[float | None, typer.Option(help="job wall-clock limit in seconds")] = None,
    output_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    api_url: Annotated[str | None, typer.Option("--api-url", envvar="TRAINMASTER_API_URL")] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="TRAINMASTER_TOKEN", show_default=False)] = None,
) -> None:
    """Measure all_reduce, all_gather, reduce_scatter and broadcast on N workers, nccl-tests style."""
    out = err_console if output_json else console
    try:
        body = job_body(workers, backend or ["torch", "grpc"], op or list(OPS), min_size, max_size, gpu, iters, warmup)
        if cpus_per_worker is not None:
            body["scaling"]["resources_per_worker"] = {"CPU": cpus_per_worker}
        if timeout is not None:
            body["timeout_s"] = timeout
        spec = JobSpec.model_validate(body)
        backends = list(dict.fromkeys("torch" if b in ("nccl", "gloo") else b for b in body["config"]["backends"]))
        total = len(backends) * len(body["config"]["ops"]) * len(MODES) * len(doubling_sizes(*_bounds(body)))
        with Client(api_url, token) as client:
            job = client.submit(spec)
            out.print(f"submitted [bold]{job.id}[/] (builtin:collectives, {workers} worker(s), {total} rows)")
            rows = follow(client, job.id, total, out)
            job.wait()
    except (ValueError, TrainmasterError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1) from None
    wrong = sum(row.wrong for row in rows)
    if output_json:
        result = {"job_id": job.id, "world_size": workers, "rows": [asdict(r) for r in rows]}
        print(json.dumps({**result, "avg_busbw": average_busbw(rows), "ratios": ratios(rows), "wrong": wrong}))
    else:
        print_tables(rows, workers, out)
    if wrong or len(rows) < total:
        err_console.print(f"[bold red]{wrong} wrong elements, {len(rows)} of {total} rows[/]")
        raise typer.Exit(1)


def job_body(
    workers: int, backends: list[str], ops: list[str], min_size: str, max_size: str, gpu: bool, iters: int, warmup: int
) -> dict[str, Any]:
    unknown = [name for name in backends if name not in ("torch", "nccl", "gloo", "grpc")]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; choose torch (nccl or gloo), grpc")
    if "nccl" in backends and "gloo" in backends:
        raise ValueError("nccl and gloo are both the job's process group: choose one")
    if [name for name in ops if name not in OPS]:
        raise ValueError(f"unknown op in {ops}; choose from {', '.join(OPS)}")
    gpu = gpu or "nccl" in backends
    group = "nccl" if "nccl" in backends else "gloo" if "gloo" in backends else "auto"
    smallest, largest = parse_size(min_size), parse_size(max_size)
    if not 1 <= smallest <= largest:
        raise ValueError("sizes must satisfy 1 <= --min-size <= --max-size")
    config: dict[str, Any] = {"backends": backends, "ops": ops, "min_size": smallest, "max_size": largest}
    config |= {"iters": iters, "warmup": warmup}
    scaling = {"num_workers": workers, "use_gpu": gpu}
    name = f"collectives-{workers}x-{'-'.join(backends)}"[:128]
    return {"name": name, "entrypoint": "builtin:collectives", "scaling": scaling, "backend": group, "config": config}


def _bounds(body: dict[str, Any]) -> tuple[int, int]:
    return body["config"]["min_size"], body["config"]["max_size"]


def print_tables(rows: list[PointRow], world_size: int, out: Console) -> None:
    backends = list(dict.fromkeys(row.backend for row in rows))
    ops = list(dict.fromkeys(row.op for row in rows))
    for backend in backends:
        for op in ops:
            out.print(op_table(rows, backend, op, world_size))
            out.print()
    found = ratios(rows)
    if found:
        out.print(ratio_table(found))
    for backend, per_op in average_busbw(rows).items():
        out.print(f"[bold]{backend}[/]: avg bus bandwidth {per_op['all']:.3f} GB/s over {len(ops)} op(s)")
    out.print(f"#wrong total: {sum(row.wrong for row in rows)}")
