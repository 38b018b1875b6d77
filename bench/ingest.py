"""Metric ingest throughput through the API, against a direct psycopg COPY into the same table.

What it measures
    The script creates a fresh database `tm_bench_<random>` on `--database-url`, migrates it, makes a
    project token, and starts the real `trainmaster api` console script (one uvicorn worker, its
    default) as a subprocess on a free loopback port. It submits one job per phase (`POST /v1/jobs`; no
    dispatcher runs, so they stay queued) and makes a job token for each, as the dispatcher would.

    API phase: a second process (multiprocessing, spawn) first encodes every request body (so the
    client's JSON work is not on the clock), then runs `--senders` asyncio tasks sharing one
    `httpx.AsyncClient` (keep-alive) that `POST /v1/jobs/{id}/metrics` batches of `--batch` points, each
    point one value (`{"step": i, "values": {"loss": v}, "rank": 0, "ts": ...}`, the shape
    `trainmaster.log` sends), so a point is a row, each batch with its own `batch_id`. `--warmup-batches`
    go first, unmeasured; then `--points` points are timed from the first request to the last response.
    Every answer must be 201 with `stored` equal to the batch size, and the table must then hold exactly
    the rows sent. With `--extra-workers N` (default 2; 0 skips it) the phase runs once more against a
    fresh `trainmaster api --workers N`.

The peer
    The same number of asyncio tasks in the same kind of second process, each with its own psycopg
    autocommit connection, run `COPY metric_points (job_id, attempt, rank, step, name, value, ts) FROM
    STDIN` with `write_row` per row (the call the API's `copy_points` makes), one COPY (one transaction)
    per batch of the same size, for the same number of points into the same table. That is the floor
    under the API's ingest: no HTTP, JSON, validation, auth, per-job lock, batch-id claim, latest-metrics
    update or NOTIFY.

Run it from the repository root (results go to bench/results/ingest.{json,md}):

    .venv/bin/python bench/ingest.py [--senders 4] [--batch 1000] [--points 500000] [--extra-workers 2]

Before measuring it waits (up to `--quiet-timeout` seconds, polling every 10 s) for the 1-minute load
average to fall below `--quiet-load`, then proceeds anyway and records it. Everything it creates (the
API processes, the database) is removed at the end, on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import (
    DEFAULT_DATABASE_URL,
    RESULTS,
    job_token,
    load_1m,
    percentile,
    project_token,
    raise_on_sigterm,
    run_in_second_process,
    run_main,
    run_metadata,
    running_api,
    scratch_database,
    submit_job,
    wait_for_quiet,
    write_results,
)

from api.db import migrate
from api.settings import libpq_url

NAME = "ingest"
REQUEST_TIMEOUT_S = 60.0
TARGET_POINTS_PER_S = 50_000.0
TARGET_RATIO = 0.3
COPY_SQL = "COPY metric_points (job_id, attempt, rank, step, name, value, ts) FROM STDIN"
METRIC_NAME = "loss"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class PhaseConfig:
    """What one load phase needs; pickled into the second process."""

    kind: str  # "api" or "copy"
    target: str  # API base URL, or the libpq URL of the bench database
    token: str
    job_id: str
    senders: int
    batch: int
    batches: int  # measured
    warmup_batches: int
    server_pgid: int = 0  # process group of the API, for its CPU time; 0 for the peer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL, help="server to create the bench DB on")
    parser.add_argument("--senders", type=int, default=4, help="concurrent senders (default 4)")
    parser.add_argument("--batch", type=int, default=1000, help="points per request / COPY (default 1000)")
    parser.add_argument("--points", type=int, default=500_000, help="measured points per phase (default 500000)")
    parser.add_argument("--warmup-batches", type=int, default=8, help="unmeasured batches first (default 8)")
    parser.add_argument("--extra-workers", type=int, default=2, help="also run the API with this many workers; 0: no")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="wait for a 1-min load average below this")
    parser.add_argument("--quiet-timeout", type=float, default=300.0, help="seconds to wait for it; 0: do not")
    parser.add_argument("--output", type=Path, default=RESULTS / f"{NAME}.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.senders < 1 or args.batch < 1 or args.points < args.batch or args.warmup_batches < 0:
        parser.error("--senders and --batch must be >= 1, --points >= --batch, --warmup-batches >= 0")
    if args.extra_workers < 0 or args.extra_workers == 1 or args.quiet_timeout < 0:
        parser.error("--extra-workers must be 0 or >= 2, --quiet-timeout >= 0")
    return args


# --------------------------------------------------------------------------- what is sent


def batch_steps(index: int, batch: int) -> range:
    return range(index * batch, (index + 1) * batch)


def encode_body(index: int, batch: int, ts: str) -> bytes:
    points = [
        {"step": i, "values": {METRIC_NAME: 1.0 / (i + 1)}, "rank": 0, "ts": ts} for i in batch_steps(index, batch)
    ]
    return json.dumps({"batch_id": str(uuid.uuid4()), "attempt": None, "points": points}).encode()


def copy_rows(job_id: uuid.UUID, index: int, batch: int, ts: datetime) -> Iterator[tuple[Any, ...]]:
    return ((job_id, None, 0, i, METRIC_NAME, 1.0 / (i + 1), ts) for i in batch_steps(index, batch))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in group `pgid` (the API and its workers)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited meanwhile
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores together."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


@dataclass
class CpuSnapshot:
    client_s: float
    server_s: float
    machine_busy_s: float

    @classmethod
    def take(cls, server_pgid: int) -> CpuSnapshot:
        server = process_group_cpu_s(server_pgid) if server_pgid else math.nan
        return cls(time.process_time(), server, machine_cpu_s()[0])


@dataclass
class Timing:
    """Wall-clock span of the measured batches, each one's latency, and the CPU spent meanwhile."""

    server_pgid: int = 0
    first_start: float = math.inf
    last_end: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: list[CpuSnapshot] = field(default_factory=list)

    def __enter__(self) -> Timing:
        self.cpu.append(CpuSnapshot.take(self.server_pgid))
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu.append(CpuSnapshot.take(self.server_pgid))

    def record(self, started: float, ended: float) -> None:
        self.first_start = min(self.first_start, started)
        self.last_end = max(self.last_end, ended)
        self.latencies.append(ended - started)

    def as_dict(self) -> dict[str, Any]:
        start, end = self.cpu
        elapsed = self.last_end - self.first_start
        return {
            "elapsed_s": elapsed,
            "latencies": self.latencies,
            "client_cpu_s": end.client_s - start.client_s,
            "server_cpu_s": end.server_s - start.server_s,
            "machine_busy_cores": (end.machine_busy_s - start.machine_busy_s) / elapsed,
        }


# --------------------------------------------------------------------------- the API path


async def post_batch(client: httpx.AsyncClient, url: str, body: bytes, batch: int) -> None:
    response = await client.post(url, content=body, headers={"Content-Type": "application/json"})
    if response.status_code != 201:
        raise RuntimeError(f"POST {url}: HTTP {response.status_code}: {response.text[:300]}")
    stored = response.json()["stored"]
    if stored != batch:
        raise RuntimeError(f"POST {url}: stored {stored} of {batch} points")


async def api_sender(
    client: httpx.AsyncClient, url: str, bodies: Iterator[bytes], batch: int, timing: Timing | None
) -> None:
    for body in bodies:  # one shared iterator: each sender takes the next batch when it is free
        started = time.monotonic()
        await post_batch(client, url, body, batch)
        if timing is not None:
            timing.record(started, time.monotonic())


async def api_load(config: PhaseConfig) -> dict[str, Any]:
    ts = datetime.now(timezone.utc).isoformat()
    total = config.warmup_batches + config.batches
    bodies = [encode_body(i, config.batch, ts) for i in range(total)]
    url = f"/v1/jobs/{config.job_id}/metrics"
    limits = httpx.Limits(max_connections=config.senders, max_keepalive_connections=config.senders)
    headers = {"Authorization": f"Bearer {config.token}"}
    async with httpx.AsyncClient(
        base_url=config.target, headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S
    ) as client:
        warmup = iter(bodies[: config.warmup_batches])
        await asyncio.gather(*(api_sender(client, url, warmup, config.batch, None) for _ in range(config.senders)))
        measured = iter(bodies[config.warmup_batches :])
        with Timing(server_pgid=config.server_pgid) as timing:
            await asyncio.gather(
                *(api_sender(client, url, measured, config.batch, timing) for _ in range(config.senders))
            )
    return timing.as_dict()


# --------------------------------------------------------------------------- the COPY peer


async def copy_batch(conn: psycopg.AsyncConnection[Any], job_id: uuid.UUID, index: int, batch: int) -> None:
    ts = datetime.now(timezone.utc)
    async with conn.cursor() as cursor, cursor.copy(COPY_SQL) as copy:
        for row in copy_rows(job_id, index, batch, ts):
            await copy.write_row(row)


async def copy_sender(
    conn: psycopg.AsyncConnection[Any], job_id: uuid.UUID, indexes: Iterator[int], batch: int, timing: Timing | None
) -> None:
    for index in indexes:
        started = time.monotonic()
        await copy_batch(conn, job_id, index, batch)  # autocommit: one COPY, one transaction
        if timing is not None:
            timing.record(started, time.monotonic())


async def copy_load(config: PhaseConfig) -> dict[str, Any]:
    job_id = uuid.UUID(config.job_id)
    conns = [
        await psycopg.AsyncConnection.connect(config.target, autocommit=True, connect_timeout=10)
        for _ in range(config.senders)
    ]
    try:
        warmup = iter(range(config.warmup_batches))
        await asyncio.gather(*(copy_sender(c, job_id, warmup, config.batch, None) for c in conns))
        measured = iter(range(config.warmup_batches, config.warmup_batches + config.batches))
        with Timing() as timing:
            await asyncio.gather(*(copy_sender(c, job_id, measured, config.batch, timing) for c in conns))
        return timing.as_dict()
    finally:
        for conn in conns:
            await conn.close()


# --------------------------------------------------------------------------- the second process


def run_load(config: PhaseConfig) -> dict[str, Any]:
    """The load process's work: one phase through the API or the COPY peer; module-level, so it pickles."""
    load = api_load if config.kind == "api" else copy_load
    return asyncio.run(load(config))


def run_phase(config: PhaseConfig) -> dict[str, Any]:
    budget = 120 + (config.batches + config.warmup_batches) * REQUEST_TIMEOUT_S / config.senders
    return run_in_second_process(run_load, config, config.kind, f"bench-{config.kind}-ingest", budget)


# --------------------------------------------------------------------------- setup and teardown


def count_rows(database_url: str, job_id: str | None = None) -> int:
    with psycopg.connect(libpq_url(database_url), connect_timeout=10) as conn:
        if job_id is None:
            row = conn.execute("SELECT count(*) FROM metric_points").fetchone()
        else:
            row = conn.execute("SELECT count(*) FROM metric_points WHERE job_id = %s", (uuid.UUID(job_id),)).fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- phases


def per_batch_ms(cpu_s: float, batches: int) -> float | None:
    return None if math.isnan(cpu_s) else cpu_s / batches * 1000


def phase_row(
    label: str, config: PhaseConfig, raw: dict[str, Any], rows_after: int, load: tuple[float, float]
) -> dict[str, Any]:
    points = config.batches * config.batch
    expected_rows = (config.batches + config.warmup_batches) * config.batch
    latencies = sorted(raw["latencies"])
    return {
        "path": label,
        "points": points,
        "elapsed_s": raw["elapsed_s"],
        "points_per_s": points / raw["elapsed_s"],
        "batch_p50_ms": percentile(latencies, 50) * 1000,
        "batch_p99_ms": percentile(latencies, 99) * 1000,
        "api_cpu_ms_per_batch": per_batch_ms(raw["server_cpu_s"], config.batches),
        "client_cpu_ms_per_batch": per_batch_ms(raw["client_cpu_s"], config.batches),
        "machine_busy_cores": raw["machine_busy_cores"],
        "rows_expected": expected_rows,
        "rows_in_table": rows_after,
        "rows_ok": rows_after == expected_rows,
        "loadavg_1m_start": load[0],
        "loadavg_1m_end": load[1],
    }


def measure(label: str, config: PhaseConfig, database_url: str) -> dict[str, Any]:
    print(f"{label}: {config.senders} senders x {config.batches} batches of {config.batch}", flush=True)
    start_load = load_1m()
    raw = run_phase(config)
    end_load = load_1m()
    rows = count_rows(database_url, config.job_id)
    row = phase_row(label, config, raw, rows, (start_load, end_load))
    print(f"  {row['points_per_s']:,.0f} points/s; rows in the table {rows:,} (expected {row['rows_expected']:,})")
    return row


def phase_config(
    args: argparse.Namespace, kind: str, target: str, token: str, job_id: str, server_pgid: int = 0
) -> PhaseConfig:
    return PhaseConfig(
        kind=kind,
        target=target,
        token=token,
        job_id=job_id,
        senders=args.senders,
        batch=args.batch,
        batches=args.points // args.batch,
        warmup_batches=args.warmup_batches,
        server_pgid=server_pgid,
    )


def api_phase(args: argparse.Namespace, database_url: str, token: str, workers: int) -> dict[str, Any]:
    log_path = RESULTS / f"{NAME}.api-{workers}w.log"
    with running_api(database_url, log_path, workers, stop_wait_s=15, kill_group=True) as (url, process):
        job_id = submit_job(url, token)
        config = phase_config(args, "api", url, job_token(database_url, job_id), job_id, process.pid)
        label = f"API POST /metrics, {workers} worker{'s' if workers > 1 else ''}"
        row = measure(label, config, database_url)
        if process.poll() is not None:
            raise RuntimeError(f"trainmaster api exited with {process.returncode} during the run; see {log_path}")
    return row


def copy_phase(args: argparse.Namespace, database_url: str, token: str) -> dict[str, Any]:
    with running_api(database_url, RESULTS / f"{NAME}.api-setup.log", stop_wait_s=15, kill_group=True) as (url, _):
        job_id = submit_job(url, token)  # a job row for the foreign key; the API is stopped before the COPY
    config = phase_config(args, "copy", libpq_url(database_url), "", job_id)
    return measure("peer: psycopg COPY", config, database_url)


def extra_phase(args: argparse.Namespace, database_url: str, token: str) -> dict[str, Any] | None:
    """The API with several uvicorn workers, when asked for; a failure is recorded, not raised."""
    if not args.extra_workers:
        return None
    try:
        return api_phase(args, database_url, token, args.extra_workers)
    except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        print(f"--workers {args.extra_workers} failed: {exc}", flush=True)
        return {"path": f"API, {args.extra_workers} workers", "error": str(exc)[:2000]}


# --------------------------------------------------------------------------- report


def with_ratios(rows: list[dict[str, Any]], peer: dict[str, Any]) -> list[dict[str, Any]]:
    for row in rows:
        if "points_per_s" in row:
            row["ratio_to_copy"] = row["points_per_s"] / peer["points_per_s"]
    return rows


def table_cells(row: dict[str, Any]) -> list[str]:
    if "error" in row:
        return [row["path"], "failed", *([""] * (len(HEADERS) - 2))]
    return [
        row["path"],
        f"{row['points']:,}",
        f"{row['elapsed_s']:.2f}",
        f"{row['points_per_s']:,.0f}",
        f"{row['ratio_to_copy']:.3f}x",
        f"{row['batch_p50_ms']:.1f}",
        f"{row['batch_p99_ms']:.1f}",
        "-" if row["api_cpu_ms_per_batch"] is None else f"{row['api_cpu_ms_per_batch']:.1f}",
        f"{row['client_cpu_ms_per_batch']:.1f}",
        f"{row['machine_busy_cores']:.2f}",
        f"{row['rows_in_table']:,}/{row['rows_expected']:,}",
    ]


HEADERS = [
    "path",
    "points",
    "seconds",
    "points/s",
    "vs COPY",
    "batch p50 ms",
    "batch p99 ms",
    "API CPU ms/batch",
    "client CPU ms/batch",
    "busy cores",
    "rows / expected",
]


def format_line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def format_table(rows: list[dict[str, Any]]) -> str:
    cells = [HEADERS, *(table_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]
    lines = [format_line(line, widths) for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "---:|" * (len(HEADERS) - 1)]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def problems(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"{row['path']}: {row['rows_in_table']:,} rows in the table, expected {row['rows_expected']:,}"
        for row in rows
        if "rows_ok" in row and not row["rows_ok"]
    ]


def interpretation(results: dict[str, Any]) -> str:
    api = results["rows"][0]
    fast = api["points_per_s"] >= TARGET_POINTS_PER_S
    close = api["ratio_to_copy"] >= TARGET_RATIO
    missed = [
        t for t, ok in ((f"{TARGET_POINTS_PER_S:,.0f} points/s", fast), (f"{TARGET_RATIO}x of COPY", close)) if not ok
    ]
    verdict = "meets both targets" if not missed else "misses " + " and ".join(missed)
    cpu = api["api_cpu_ms_per_batch"]
    ceiling = results["config"]["batch"] / cpu * 1000 if cpu else math.nan
    return (
        f"The API (1 worker) ingests {api['points_per_s']:,.0f} points/s, {api['ratio_to_copy']:.2f}x of a direct "
        f"COPY's {results['peer_points_per_s']:,.0f}: it {verdict}; its process spends {cpu:.1f} ms of CPU per "
        f"{results['config']['batch']:,}-point batch, a ceiling of ~{ceiling:,.0f} points/s on one core."
    )


def build_results(args: argparse.Namespace, rows: list[dict[str, Any]], loadavg: dict[str, Any]) -> dict[str, Any]:
    peer = next(row for row in rows if row["path"].startswith("peer"))
    return {
        **run_metadata(NAME, args, loadavg, python=".venv/bin/python"),
        "targets": {"points_per_s": TARGET_POINTS_PER_S, "ratio_to_copy": TARGET_RATIO},
        "peer": "same number of asyncio tasks, one psycopg autocommit connection each: COPY ... FROM STDIN with "
        "write_row per row, one COPY per batch, into metric_points; no HTTP, JSON, auth, lock or NOTIFY",
        "peer_points_per_s": peer["points_per_s"],
        "rows": with_ratios(rows, peer),
    }


def print_report(results: dict[str, Any]) -> None:
    print()
    print(format_table(results["rows"]))
    print("1-minute load average: " + ", ".join(f"{k} {v}" for k, v in results["loadavg_1m"].items()))
    for line in problems(results["rows"]):
        print(f"WARNING {line}")
    print(interpretation(results))


def markdown(results: dict[str, Any]) -> str:
    load, cfg, machine = results["loadavg_1m"], results["config"], results["machine"]
    return "\n".join(
        [
            "## Metric ingest throughput: API against a direct COPY",
            "",
            "```",
            results["command"],
            "```",
            "",
            f"**Machine.** {machine['cpus']} shared cores (another engineer's tests ran alongside); PostgreSQL 15 "
            f"on 127.0.0.1; Python {machine['python']}; git `{results['git']}`; measured {results['measured_at']}. "
            f"1-minute load average {load['start']:.2f} at the start (waited {load['waited_s']:.0f} s for "
            f"< {cfg['quiet_load']:g}), {load['end']:.2f} at the end. Client, API and PostgreSQL share the cores.",
            "",
            f"{cfg['senders']} concurrent senders, batches of {cfg['batch']:,} one-value points, "
            f"{cfg['points']:,} measured points per row after {cfg['warmup_batches']} warm-up batches; points/s is "
            "first request to last response. The peer: " + results["peer"] + ".",
            "",
            markdown_table(results["rows"]),
            "",
            interpretation(results),
            "",
        ]
    )


# --------------------------------------------------------------------------- main


def run_benchmark(args: argparse.Namespace, database_url: str, quiet: dict[str, Any]) -> dict[str, Any]:
    """Everything between creating the database and dropping it; returns the results."""
    migrate.upgrade(database_url)
    token = project_token(database_url)
    loadavg: dict[str, Any] = {**quiet, "start": load_1m()}
    rows = [api_phase(args, database_url, token, 1), copy_phase(args, database_url, token)]
    extra = extra_phase(args, database_url, token)
    if extra is not None:
        rows.append(extra)
    loadavg["end"] = load_1m()
    total = sum(row.get("rows_expected", 0) for row in rows)
    print(f"rows in metric_points: {count_rows(database_url):,} (expected {total:,})", flush=True)
    return build_results(args, rows, loadavg)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    RESULTS.mkdir(parents=True, exist_ok=True)
    quiet = wait_for_quiet(args.quiet_load, args.quiet_timeout)
    with scratch_database(args.database_url) as database_url:
        results = run_benchmark(args, database_url, quiet)
    print_report(results)
    write_results(results, args.output, (args.output.with_suffix(".md"), markdown(results)))
    if problems(results["rows"]):
        print("the table does not hold the rows sent: these figures are not valid", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "the API processes were stopped and the database dropped")
