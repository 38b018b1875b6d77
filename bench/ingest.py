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
phase is divided by its round's peer and the median of the rounds is reported (a shared machine's speed
drifts between minutes; a pair a few seconds apart shares the drift). One job's batches are written
one at a time (api/metrics/repository.py), so `--jobs 1` gives one job's ceiling, more the platform's.

    .venv/bin/python bench/ingest.py [--senders 4] [--batch 1000] [--points 500000] [--jobs 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import psycopg
from clients import Phase, drive
from harness import api_process, ms, parse_args, run, scratch_database, submit_job

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
    requests = [("POST", f"/v1/jobs/{jobs[n % len(jobs)]}/metrics", body) for n, body in enumerate(bodies)]

    def batches(first: int, last: int | None) -> tuple[float, list[float]]:
        phase = Phase(url, {"Authorization": f"Bearer {token}"}, requests[first:last], 201, once=True)
        outcome = drive(phase, args.senders, args.procs)
        if outcome.errors:
            raise RuntimeError(f"ingest requests failed: {dict(outcome.errors)}")
        return outcome.seconds, outcome.latencies

    def phase() -> tuple[float, list[float]]:
        if args.warmup_batches:
            batches(0, args.warmup_batches)
        return batches(args.warmup_batches, None)

    return phase


def copy_batches(database_url: str, jobs: list[str], args: argparse.Namespace) -> Timed:
    """Each connection takes the next batch when it is free: the warm-up ones, then the measured ones, timed."""

    async def phase() -> tuple[float, list[float]]:
        began, ids = time.time(), [uuid.UUID(job) for job in jobs]
        total = args.warmup_batches + args.points // args.batch
        stamps = [datetime.fromtimestamp(began + i * 1e-3, timezone.utc) for i in range(total * args.batch)]
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
            warmup, measured = iter(range(args.warmup_batches)), iter(range(args.warmup_batches, total))
            latencies: list[float] = []
            await asyncio.gather(*(drain(conn, warmup, []) for conn in conns))
            started = time.monotonic()
            await asyncio.gather(*(drain(conn, measured, latencies) for conn in conns))
            return time.monotonic() - started, latencies
        finally:
            for conn in conns:
                await conn.close()

    return lambda: asyncio.run(phase())


def measure(path: str, phase: Timed, url: str, jobs: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Run one phase; its row: throughput, batch latency, and the rows the table holds."""
    batches = args.points // args.batch
    print(f"{path}: {args.senders} senders x {batches} batches of {args.batch}, {len(jobs)} job(s)", flush=True)
    seconds, latencies = phase()
    with psycopg.connect(url) as conn:
        count = "SELECT count(*) FROM metric_points WHERE job_id = ANY(%s)"
        row = conn.execute(count, ([uuid.UUID(job) for job in jobs],)).fetchone()
    return {
        "path": path,
        "jobs": len(jobs),
        "points": batches * args.batch,
        "seconds": seconds,
        "points_per_s": batches * args.batch / seconds,
        **ms(latencies, 50, 99, prefix="batch_"),
        "rows_sent": (batches + args.warmup_batches) * args.batch,
        "rows_stored": row[0] if row else 0,
    }


def main() -> None:
    args = parse_args(
        __doc__,
        ("--senders", 4, "concurrent senders"),
        ("--batch", 1000, "points per request / per COPY"),
        ("--points", 500_000, "measured points per phase"),
        ("--warmup-batches", 8, "unmeasured batches first"),
        ("--api-workers", ["default", "1"], "API worker counts, one phase each"),
        ("--jobs", 1, "jobs the batches go to, in turn (API and peer alike)"),
        ("--reps", 3, "rounds of the API phases and the peer's"),
        ("--client-procs", 2, "processes the senders are spread over", {"dest": "procs"}),
        database=True,
    )
    if args.points < args.batch:
        raise SystemExit("--points must be at least --batch")
    phases = [*args.api_workers, PEER]
    with run("ingest", args) as record, scratch_database(record, args.database_url) as url:
        rows: list[dict[str, Any]] = []
        bodies = metric_bodies(args)
        with api_process(url, 1) as api:  # every phase's jobs, queued up front (per worker count, then the peer's)
            rounds = [[[submit_job(api) for _ in range(args.jobs)] for _ in phases] for _ in range(args.reps)]

        def one(workers: str, jobs: list[str]) -> dict[str, Any]:
            if workers == PEER:
                return measure(PEER, copy_batches(url, jobs, args), url, jobs, args)
            with api_process(url, None if workers == "default" else int(workers)) as api:
                phase = api_batches(api.url, api.token, jobs, bodies, args)
                path = f"POST /v1/jobs/{{id}}/metrics, API workers: {workers}"
                return measure(path, phase, url, jobs, args)

        for rep, jobs in enumerate(rounds, start=1):
            # the table grows by every phase: the peer goes last in odd rounds and first in even ones
            order = list(zip(phases, jobs, strict=True))
            measured = {
                workers: one(workers, phase_jobs)
                for workers, phase_jobs in (order if rep % 2 else order[-1:] + order[:-1])
            }
            peer = measured.pop(PEER) | {"round": rep}
            for row in measured.values():
                row |= {"round": rep, "ratio": row["points_per_s"] / peer["points_per_s"]}
                print(f"round {rep}: {row['path']}: {row['ratio']:.3f}x the peer", flush=True)
            rows += [*measured.values(), peer]
        record.tables["ingest"] = rows
        peers = statistics.median(row["points_per_s"] for row in rows if row["path"] == PEER)
        for path in dict.fromkeys(row["path"] for row in rows if "ratio" in row):
            mine = [row for row in rows if row["path"] == path]
            api_rate = statistics.median(row["points_per_s"] for row in mine)
            record.ratio(f"{path}, points/s, median of {len(mine)} rounds", api_rate, PEER, peers)
            ratios = statistics.median(row["ratio"] for row in mine)
            record.ratio(f"{path}, median of the rounds' ratios", ratios, "peer of the same round", 1.0)
        record.valid = all(row["rows_stored"] == row["rows_sent"] for row in rows)


if __name__ == "__main__":
    main()
