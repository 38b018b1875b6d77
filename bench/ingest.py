"""Metric ingest throughput: POST /v1/jobs/{id}/metrics against psycopg COPY into the same table.

The API: `trainmaster api` on a scratch database, once per `--api-workers` count (`default`: the API's
own). `--senders` blocking clients over `--client-procs` processes (bench/clients.py) POST bodies encoded
beforehand, batches of `--batch` one-value points shaped as trainmaster.log sends them (Unix-seconds
`ts`, a batch_id, an attempt) to `--jobs` queued jobs in turn: `--warmup-batches`, then `--points`
points timed from the first request to the last answer. Every row sent must be stored.

The peer: as many psycopg autocommit connections run `COPY metric_points (...) FROM STDIN`, one COPY
per batch of the same size, the same points into the same table and as many jobs: the floor under the
API's ingest (no HTTP, JSON, validation, auth, per-job lock, batch-id claim, latest-metrics, NOTIFY).

`--reps` rounds of the API phases and the peer's (last in odd rounds, first in even ones): each API
phase is divided by its round's peer and the median of the rounds is reported (this machine drifts by
a quarter between minutes; a pair a few seconds apart shares the drift). One job's batches are written
one at a time (api/metrics/repository.py), so `--jobs 1` gives one job's ceiling, more the platform's.

    .venv/bin/python bench/ingest.py [--senders 4] [--batch 1000] [--points 500000] [--jobs 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
from clients import Outcome, Phase, Request, drive
from harness import api_process, ms, parser, run, scratch_database, submit_job

COPY = "COPY metric_points (job_id, attempt, rank, step, name, value, ts) FROM STDIN"
PEER = "peer: psycopg COPY"
Timed = Callable[[], tuple[float, list[float]]]  # a phase: its seconds and its batches' latencies


def metric_bodies(args: argparse.Namespace) -> list[bytes]:
    """Every API phase's request bodies, encoded once (each phase writes to jobs of its own)."""
    began = time.time()

    def body(n: int) -> bytes:
        steps = range(n * args.batch, (n + 1) * args.batch)
        points = [{"step": i, "values": {"loss": 1 / (i + 1)}, "rank": 0, "ts": began + i * 1e-3} for i in steps]
        return json.dumps({"batch_id": str(uuid.uuid4()), "attempt": 1, "points": points}).encode()

    return [body(n) for n in range(args.warmup_batches + args.points // args.batch)]


def api_batches(url: str, token: str, jobs: list[str], bodies: list[bytes], args: argparse.Namespace) -> Timed:
    paths = [f"/v1/jobs/{job}/metrics" for job in jobs]
    requests: list[Request] = [("POST", paths[n % len(paths)], body) for n, body in enumerate(bodies)]

    def batches(todo: list[Request]) -> Outcome:
        outcome = drive(
            Phase(url, {"Authorization": f"Bearer {token}"}, todo, 201, once=True), args.senders, args.procs
        )
        if outcome.errors:
            raise RuntimeError(f"ingest requests failed: {dict(outcome.errors)}")
        return outcome

    def phase() -> tuple[float, list[float]]:
        batches(requests[: args.warmup_batches])
        measured = batches(requests[args.warmup_batches :])
        return measured.seconds, measured.latencies

    return phase


def copy_batches(database_url: str, jobs: list[str], args: argparse.Namespace) -> Timed:
    """Each connection takes the next batch when it is free: the warm-up ones, then the measured ones, timed."""

    async def phase() -> tuple[float, list[float]]:
        began, ids = time.time(), [uuid.UUID(job) for job in jobs]
        total = (args.warmup_batches + args.points // args.batch) * args.batch
        stamps = [datetime.fromtimestamp(began + i * 1e-3, timezone.utc) for i in range(total)]  # not timed
        conns = [
            await psycopg.AsyncConnection.connect(database_url, autocommit=True, connect_timeout=10)
            for _ in range(args.senders)
        ]

        async def drain(conn: psycopg.AsyncConnection[Any], batches: Iterator[int], latencies: list[float]) -> None:
            for index in batches:
                started, job = time.monotonic(), ids[index % len(ids)]
                async with conn.cursor() as cursor, cursor.copy(COPY) as copy:  # autocommit: one COPY, one transaction
                    for i in range(index * args.batch, (index + 1) * args.batch):
                        await copy.write_row((job, 1, 0, i, "loss", 1 / (i + 1), stamps[i]))
                latencies.append(time.monotonic() - started)

        try:
            warmup = iter(range(args.warmup_batches))
            await asyncio.gather(*(drain(conn, warmup, []) for conn in conns))
            measured = iter(range(args.warmup_batches, args.warmup_batches + args.points // args.batch))
            latencies: list[float] = []
            started = time.monotonic()
            await asyncio.gather(*(drain(conn, measured, latencies) for conn in conns))
            return time.monotonic() - started, latencies
        finally:
            for conn in conns:
                await conn.close()

    return lambda: asyncio.run(phase())


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes in group `pgid` (the API and its uvicorn workers)."""
    if not pgid:
        return 0.0
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited meanwhile
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(
    path: str, phase: Timed, database_url: str, jobs: list[str], args: argparse.Namespace, api_pgid: int = 0
) -> dict[str, Any]:
    """Run one phase; its row: throughput, batch latency, CPU per batch, and the rows the table holds."""
    batches = args.points // args.batch
    print(f"{path}: {args.senders} senders x {batches} batches of {args.batch}, {len(jobs)} job(s)", flush=True)
    api_cpu, client_cpu = group_cpu_s(api_pgid), time.process_time()
    seconds, latencies = phase()
    api_cpu, client_cpu = group_cpu_s(api_pgid) - api_cpu, time.process_time() - client_cpu
    with psycopg.connect(database_url) as conn:
        ids = [uuid.UUID(job) for job in jobs]
        row = conn.execute("SELECT count(*) FROM metric_points WHERE job_id = ANY(%s)", (ids,)).fetchone()
    return {
        "path": path,
        "jobs": len(jobs),
        "points": batches * args.batch,
        "seconds": seconds,
        "points_per_s": batches * args.batch / seconds,
        **{f"batch_{k}": v for k, v in ms(latencies, 50, 99).items()},
        "api_cpu_ms_per_batch": api_cpu / batches * 1000 if api_pgid else None,
        "client_cpu_ms_per_batch": client_cpu / batches * 1000,
        "rows_sent": (batches + args.warmup_batches) * args.batch,
        "rows_stored": row[0] if row else 0,
    }


def main() -> int:
    p = parser(__doc__, database=True)
    p.add_argument("--senders", type=int, default=4, help="concurrent senders")
    p.add_argument("--batch", type=int, default=1000, help="points per request / per COPY")
    p.add_argument("--points", type=int, default=500_000, help="measured points per phase")
    p.add_argument("--warmup-batches", type=int, default=8, help="unmeasured batches first")
    p.add_argument("--api-workers", nargs="+", default=["default", "1"], help="API worker counts, one phase each")
    p.add_argument("--jobs", type=int, default=1, help="jobs the batches go to, in turn (API and peer alike)")
    p.add_argument("--reps", type=int, default=3, help="rounds of the API phases and the peer's")
    p.add_argument("--client-procs", dest="procs", type=int, default=2, help="processes the senders are spread over")
    args = p.parse_args()
    if args.points < args.batch:
        p.error("--points must be at least --batch")
    with run("ingest", args) as record, scratch_database(record, args.database_url) as db:
        rows: list[dict[str, Any]] = []
        bodies = metric_bodies(args)
        with api_process(db.url, 1) as api:  # every phase's jobs, queued up front (per worker count, then the peer's)

            def queued() -> list[str]:
                return [submit_job(api.url, db.token) for _ in range(args.jobs)]

            rounds = [[queued() for _ in [*args.api_workers, PEER]] for _ in range(args.reps)]
        for rep, jobs in enumerate(rounds, start=1):
            order = list(zip([*args.api_workers, PEER], jobs, strict=True))
            # the table grows by every phase: the peer goes last in odd rounds and first in even ones
            order = order if rep % 2 else order[-1:] + order[:-1]
            measured: list[dict[str, Any]] = []
            peer: dict[str, Any] = {}
            for workers, phase_jobs in order:
                if workers == PEER:
                    peer = measure(PEER, copy_batches(db.url, phase_jobs, args), db.url, phase_jobs, args)
                    continue
                with api_process(db.url, None if workers == "default" else int(workers)) as api:
                    path = f"POST /v1/jobs/{{id}}/metrics, API workers: {workers}"
                    phase = api_batches(api.url, db.token, phase_jobs, bodies, args)
                    measured.append(measure(path, phase, db.url, phase_jobs, args, api.pid))
            for row in (*measured, peer):
                row["round"] = rep
                if row is not peer:
                    row["ratio"] = row["points_per_s"] / peer["points_per_s"]
                    print(f"round {rep}: {row['path']}: {row['ratio']:.3f}x the peer", flush=True)
            rows += [*measured, peer]
        record.tables["ingest"] = rows
        peers = statistics.median(row["points_per_s"] for row in rows if row["path"] == PEER)
        for path in dict.fromkeys(row["path"] for row in rows if "ratio" in row):
            mine = [row for row in rows if row["path"] == path]
            api_rate = statistics.median(row["points_per_s"] for row in mine)
            record.ratio(f"{path}, points/s, median of {len(mine)} rounds", api_rate, PEER, peers)
            ratios = statistics.median(row["ratio"] for row in mine)
            record.ratio(f"{path}, median of the rounds' ratios", ratios, "peer of the same round", 1.0)
        record.valid = all(row["rows_stored"] == row["rows_sent"] for row in rows)
    return 0 if record.valid else 1


if __name__ == "__main__":
    sys.exit(main())
