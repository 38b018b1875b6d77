"""Latency of `POST /v1/jobs` and `GET /v1/jobs/{id}` under load, against a raw-PostgreSQL peer.

What it measures
    The script creates a fresh database `tm_bench_<random>` on `--database-url`, migrates it, makes a
    project token, and starts the real `trainmaster api` console script as a subprocess on a free
    loopback port. A second process (multiprocessing, spawn) then runs `--concurrency` asyncio clients
    (httpx.AsyncClient) for `--duration` seconds, each sending a 50/50 mix (`--post-ratio`) of
    `POST /v1/jobs` and `GET /v1/jobs/{id}` of jobs created in this run, and records every latency.

The peer
    Speed is reported as a ratio against a peer run side by side: the same number of asyncio clients,
    in the same kind of second process, talk to the same PostgreSQL directly with psycopg (one
    autocommit connection each) for `--peer-duration` seconds: `INSERT ... RETURNING id` of a row shaped
    like a job (uuid, name, status, JSONB spec and labels, hash) into a scratch table with a primary key
    only, and `SELECT * ... WHERE id = %s` of a row it inserted. That is the floor the API's own
    database work sits on: no HTTP, no auth lookup, no ORM, no events, no queue position.
    The two phases run one after the other (API, then peer), each after `--warmup` unmeasured seconds;
    the 1-minute load average around them goes into the results, because on a shared machine a ratio
    is only as good as the quiet it was measured in. The API listens on 127.0.0.1 only.

Run it from the repository root (results also go to bench/results/api_load.json):

    .venv/bin/python bench/api_load.py [--concurrency 8] [--duration 30] [--peer-duration 10]

Everything it creates (the API process, the database) is removed at the end, on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import (
    DEFAULT_DATABASE_URL,
    RESULTS,
    percentile,
    project_token,
    raise_on_sigterm,
    run_in_second_process,
    run_main,
    run_metadata,
    running_api,
    scratch_database,
    write_results,
)
from psycopg.types.json import Jsonb

from api.db import migrate
from api.settings import libpq_url

JOB_SPEC: dict[str, Any] = {"name": "bench", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}}
TREND_WINDOW_S = 5.0

API_POST = "POST /v1/jobs"
API_GET = "GET /v1/jobs/{id}"
PEER_INSERT = "peer: psycopg INSERT"
PEER_SELECT = "peer: psycopg SELECT by PK"
PAIRS = ((API_POST, PEER_INSERT), (API_GET, PEER_SELECT))

PEER_TABLE = "bench_peer_jobs"
PEER_DDL = f"""
CREATE TABLE {PEER_TABLE} (
    id uuid PRIMARY KEY,
    name varchar(128) NOT NULL,
    status text NOT NULL,
    spec jsonb NOT NULL,
    labels jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    priority smallint NOT NULL DEFAULT 0,
    request_hash varchar(64),
    pending_reason text,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
PEER_INSERT_SQL = f"""
INSERT INTO {PEER_TABLE} (id, name, status, spec, labels, priority, request_hash, pending_reason)
VALUES (%s, %s, 'queued', %s, %s, 0, %s, 'waiting for the dispatcher') RETURNING id
"""
PEER_SELECT_SQL = f"SELECT * FROM {PEER_TABLE} WHERE id = %s"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LoadConfig:
    """What one load phase needs; pickled into the second process."""

    target: str  # API base URL, or the libpq URL of the bench database for the peer
    token: str
    concurrency: int
    duration_s: float
    warmup_s: float
    post_ratio: float
    request_timeout_s: float
    seed: int


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL, help="server to create the bench DB on")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds against the API")
    parser.add_argument("--peer-duration", type=float, default=10.0, help="measured seconds against the peer")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each phase")
    parser.add_argument("--post-ratio", type=float, default=0.5, help="share of creates in the mix")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="per-request timeout, seconds")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix")
    parser.add_argument("--output", type=Path, default=RESULTS / "api_load.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.peer_duration <= 0 or args.warmup < 0:
        parser.error("--concurrency must be >= 1, durations > 0, --warmup >= 0")
    if not 0.0 <= args.post_ratio <= 1.0:
        parser.error("--post-ratio must be between 0 and 1")
    return args


# --------------------------------------------------------------------------- recording


@dataclass
class Recorder:
    """Latencies (offset into the measured window, seconds) per route; errors per route and kind."""

    window_start: float
    window_end: float
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    errors: dict[str, Counter[str]] = field(default_factory=dict)
    warmup_errors: Counter[str] = field(default_factory=Counter)

    def measured(self, began: float) -> bool:
        return self.window_start <= began < self.window_end

    def ok(self, route: str, began: float, ended: float) -> None:
        if self.measured(began):
            self.samples.setdefault(route, []).append((began - self.window_start, ended - began))

    def error(self, route: str, kind: str, began: float) -> None:
        if self.measured(began):
            self.errors.setdefault(route, Counter())[kind] += 1
        elif began < self.window_start:
            self.warmup_errors[f"{route}: {kind}"] += 1

    def as_dict(self) -> dict[str, Any]:
        routes = sorted(set(self.samples) | set(self.errors))
        return {
            "samples": {route: self.samples.get(route, []) for route in routes},
            "errors": {route: dict(self.errors.get(route, Counter())) for route in routes},
            "warmup_errors": dict(self.warmup_errors),
        }


class UnexpectedStatus(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.kind = f"HTTP {status_code}"


async def timed(recorder: Recorder, route: str, operation: Awaitable[None]) -> None:
    began = time.monotonic()
    try:
        await operation
    except UnexpectedStatus as exc:
        recorder.error(route, exc.kind, began)
    except Exception as exc:
        recorder.error(route, type(exc).__name__, began)
    else:
        recorder.ok(route, began, time.monotonic())


def new_recorder(config: LoadConfig) -> Recorder:
    start = time.monotonic() + config.warmup_s
    return Recorder(window_start=start, window_end=start + config.duration_s)


# --------------------------------------------------------------------------- load against the API


async def post_job(client: httpx.AsyncClient, ids: list[str]) -> None:
    response = await client.post("/v1/jobs", json=JOB_SPEC)
    if response.status_code != 201:
        raise UnexpectedStatus(response.status_code)
    ids.append(response.json()["id"])


async def get_job(client: httpx.AsyncClient, job_id: str) -> None:
    response = await client.get(f"/v1/jobs/{job_id}")
    if response.status_code != 200:
        raise UnexpectedStatus(response.status_code)
    response.json()


async def api_client(
    client: httpx.AsyncClient, recorder: Recorder, ids: list[str], rng: random.Random, post_ratio: float
) -> None:
    while time.monotonic() < recorder.window_end:
        if not ids or rng.random() < post_ratio:
            await timed(recorder, API_POST, post_job(client, ids))
        else:
            job_id = rng.choice(ids)
            await timed(recorder, API_GET, get_job(client, job_id))


async def api_load(config: LoadConfig) -> Recorder:
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    headers = {"Authorization": f"Bearer {config.token}"}
    async with httpx.AsyncClient(
        base_url=config.target, headers=headers, limits=limits, timeout=config.request_timeout_s
    ) as client:
        recorder = new_recorder(config)
        ids: list[str] = []
        rngs = [random.Random(config.seed * 1000 + n) for n in range(config.concurrency)]
        await asyncio.gather(*(api_client(client, recorder, ids, rng, config.post_ratio) for rng in rngs))
    return recorder


# --------------------------------------------------------------------------- load against the peer


async def peer_insert(conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> None:
    spec = json.dumps(JOB_SPEC, sort_keys=True)
    digest = hashlib.sha256(spec.encode()).hexdigest()
    async with conn.cursor() as cur:
        await cur.execute(PEER_INSERT_SQL, (uuid.uuid4(), JOB_SPEC["name"], Jsonb(JOB_SPEC), Jsonb({}), digest))
        row = await cur.fetchone()
    assert row is not None
    ids.append(row[0])


async def peer_select(conn: psycopg.AsyncConnection[Any], job_id: uuid.UUID) -> None:
    async with conn.cursor() as cur:
        await cur.execute(PEER_SELECT_SQL, (job_id,))
        if await cur.fetchone() is None:
            raise LookupError(f"peer row {job_id} is missing")


async def peer_client(
    conn: psycopg.AsyncConnection[Any],
    recorder: Recorder,
    ids: list[uuid.UUID],
    rng: random.Random,
    post_ratio: float,
) -> None:
    while time.monotonic() < recorder.window_end:
        if not ids or rng.random() < post_ratio:
            await timed(recorder, PEER_INSERT, peer_insert(conn, ids))
        else:
            job_id = rng.choice(ids)
            await timed(recorder, PEER_SELECT, peer_select(conn, job_id))


async def peer_load(config: LoadConfig) -> Recorder:
    timeout = max(1, int(config.request_timeout_s))
    conns = [
        await psycopg.AsyncConnection.connect(config.target, autocommit=True, connect_timeout=timeout)
        for _ in range(config.concurrency)
    ]
    try:
        recorder = new_recorder(config)
        ids: list[uuid.UUID] = []
        rngs = [random.Random(config.seed * 1000 + n) for n in range(config.concurrency)]
        pairs = zip(conns, rngs, strict=True)
        clients = [peer_client(conn, recorder, ids, rng, config.post_ratio) for conn, rng in pairs]
        await asyncio.gather(*clients)
        return recorder
    finally:
        for conn in conns:
            await conn.close()


# --------------------------------------------------------------------------- the second process


def run_load(kind_and_config: tuple[str, LoadConfig]) -> dict[str, Any]:
    """The load process's work: one phase against the API or the peer; module-level, so it pickles."""
    kind, config = kind_and_config
    load = api_load if kind == "api" else peer_load
    return asyncio.run(load(config)).as_dict()


def run_phase(kind: str, config: LoadConfig) -> dict[str, Any]:
    budget = config.warmup_s + config.duration_s + config.request_timeout_s + 60
    return run_in_second_process(run_load, (kind, config), kind, f"bench-{kind}-load", budget)


# --------------------------------------------------------------------------- setup


def create_peer_table(database_url: str) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(PEER_DDL)


# --------------------------------------------------------------------------- statistics and report


def route_stats(samples: Sequence[Sequence[float]], errors: dict[str, int], duration_s: float) -> dict[str, Any]:
    latencies = sorted(latency for _, latency in samples)
    early = sorted(latency for offset, latency in samples if offset < TREND_WINDOW_S)
    late = sorted(latency for offset, latency in samples if offset >= duration_s - TREND_WINDOW_S)
    return {
        "requests": len(latencies) + sum(errors.values()),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "req_per_s": len(latencies) / duration_s,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "mean_ms": (sum(latencies) / len(latencies) * 1000) if latencies else math.nan,
        "p50_first_5s_ms": percentile(early, 50) * 1000,
        "p50_last_5s_ms": percentile(late, 50) * 1000,
    }


def phase_stats(raw: dict[str, Any], duration_s: float) -> dict[str, dict[str, Any]]:
    return {route: route_stats(raw["samples"][route], raw["errors"][route], duration_s) for route in raw["samples"]}


def ratios(api: dict[str, dict[str, Any]], peer: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for api_route, peer_route in PAIRS:
        if api_route in api and peer_route in peer:
            a, p = api[api_route], peer[peer_route]
            out[f"{api_route} / {peer_route}"] = {
                "p50": a["p50_ms"] / p["p50_ms"],
                "p99": a["p99_ms"] / p["p99_ms"],
                "req_per_s": a["req_per_s"] / p["req_per_s"],
            }
    return out


def format_table(stats: dict[str, dict[str, Any]]) -> str:
    header = f"{'route':<28} {'requests':>9} {'errors':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
    lines = [header, "-" * len(header)]
    for route, s in stats.items():
        lines.append(
            f"{route:<28} {s['requests']:>9} {s['errors']:>7} {s['req_per_s']:>8.1f}"
            f" {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f}"
        )
    return "\n".join(lines)


def format_ratios(table: dict[str, dict[str, float]]) -> str:
    lines = [f"{'API / peer':<56} {'p50':>7} {'p99':>7} {'req/s':>7}"]
    for pair, r in table.items():
        lines.append(f"{pair:<56} {r['p50']:>6.1f}x {r['p99']:>6.1f}x {r['req_per_s']:>6.3f}x")
    return "\n".join(lines)


def error_lines(stats: dict[str, dict[str, Any]], warmup_errors: dict[str, dict[str, int]]) -> list[str]:
    lines = [f"errors on {route}: {s['error_kinds']}" for route, s in stats.items() if s["errors"]]
    lines += [f"errors in the {phase} warmup: {kinds}" for phase, kinds in warmup_errors.items() if kinds]
    return lines


def report(
    args: argparse.Namespace, api_raw: dict[str, Any], peer_raw: dict[str, Any], loadavg: dict[str, float]
) -> dict[str, Any]:
    """Print the tables and return the JSON results; `loadavg` is the 1-minute load around each phase."""
    api = phase_stats(api_raw, args.duration)
    peer = phase_stats(peer_raw, args.peer_duration)
    results = {
        **run_metadata("api_load", args, loadavg, python=Path(sys.executable).name),
        "peer": "same N asyncio clients, psycopg autocommit connection each: INSERT a job-shaped row into a "
        "scratch table (primary key only) / SELECT it by primary key; no HTTP, auth, ORM or events",
        "api_routes": api,
        "peer_routes": peer,
        "ratios": ratios(api, peer),
        "warmup_errors": {"api": api_raw["warmup_errors"], "peer": peer_raw["warmup_errors"]},
    }
    print()
    print(format_table({**api, **peer}))
    print()
    print(format_ratios(results["ratios"]))
    print(f"1-minute load average on {os.cpu_count()} CPUs: " + ", ".join(f"{k} {v:.1f}" for k, v in loadavg.items()))
    for line in error_lines({**api, **peer}, results["warmup_errors"]):
        print(f"WARNING {line}")
    for route, s in api.items():
        first, last = s["p50_first_5s_ms"], s["p50_last_5s_ms"]
        print(f"{route}: p50 in the first {TREND_WINDOW_S:g} s {first:.2f} ms, in the last {last:.2f} ms")
    return results


# --------------------------------------------------------------------------- main


def load_config(args: argparse.Namespace, target: str, token: str, duration_s: float) -> LoadConfig:
    return LoadConfig(
        target=target,
        token=token,
        concurrency=args.concurrency,
        duration_s=duration_s,
        warmup_s=args.warmup,
        post_ratio=args.post_ratio,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
    )


def run_benchmark(args: argparse.Namespace, database_url: str, log_path: Path) -> dict[str, Any]:
    """Everything between creating the database and dropping it; returns the results."""
    migrate.upgrade(database_url)
    create_peer_table(database_url)
    token = project_token(database_url)
    with running_api(database_url, log_path) as (api_url, api):
        print(f"api ready at {api_url}; {args.concurrency} clients for {args.warmup:g}+{args.duration:g} s", flush=True)
        loadavg = {"api_start": os.getloadavg()[0]}
        api_raw = run_phase("api", load_config(args, api_url, token, args.duration))
        loadavg["api_end"] = os.getloadavg()[0]
        if api.poll() is not None:
            raise RuntimeError(f"trainmaster api exited with {api.returncode} during the load; see {log_path}")
        print(f"peer: {args.concurrency} psycopg clients for {args.warmup:g}+{args.peer_duration:g} s", flush=True)
        peer_raw = run_phase("peer", load_config(args, libpq_url(database_url), "", args.peer_duration))
        loadavg["peer_end"] = os.getloadavg()[0]
    return report(args, api_raw, peer_raw, loadavg)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_path = RESULTS / "api_load.api.log"
    with scratch_database(args.database_url) as database_url:
        results = run_benchmark(args, database_url, log_path)
    write_results(results, args.output)
    stats = {**results["api_routes"], **results["peer_routes"]}
    if error_lines(stats, results["warmup_errors"]):
        print("requests failed during the run: these figures are not valid", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "the API process was stopped and the database dropped")
