"""Latency of POST /v1/jobs and GET /v1/jobs/{id} under load, against psycopg INSERT / SELECT.

The API: `trainmaster api` (one uvicorn worker) on a scratch database `tm_bench_<random>`. `--concurrency`
asyncio clients sharing one keep-alive httpx.AsyncClient send a mix (`--post-ratio`) of POST /v1/jobs and
GET /v1/jobs/{id} of a job created in this run, for `--warmup` unmeasured seconds, then `--duration`.
No dispatcher runs, so every job stays queued.

The peer: as many clients, one psycopg autocommit connection each to the same database, INSERT ...
RETURNING a job-shaped row (uuid, name, status, JSONB spec and labels, hash) into a scratch table with
only a primary key, and SELECT * of such a row by primary key, for `--peer-duration` seconds: the floor
under the API's own database work (no HTTP, auth, ORM, job event, NOTIFY or queue position).

    .venv/bin/python bench/api_load.py [--concurrency 8] [--duration 30] [--peer-duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import psycopg
from common import api_process, migrate_and_token, ms, parser, run, scratch_database
from psycopg.types.json import Jsonb

JOB: dict[str, Any] = {"name": "bench", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}}
PEER_TABLE = """CREATE TABLE bench_peer_jobs (
    id uuid PRIMARY KEY, name varchar(128) NOT NULL, status text NOT NULL, spec jsonb NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}', priority smallint NOT NULL DEFAULT 0, request_hash varchar(64),
    pending_reason text, created_at timestamptz NOT NULL DEFAULT now())"""
PEER_INSERT = """INSERT INTO bench_peer_jobs (id, name, status, spec, labels, request_hash, pending_reason)
    VALUES (%s, %s, 'queued', %s, %s, %s, 'waiting for the dispatcher') RETURNING id"""
PEER_SELECT = "SELECT * FROM bench_peer_jobs WHERE id = %s"
API_PATHS = {"create": "POST /v1/jobs", "read": "GET /v1/jobs/{id}"}
PEER_PATHS = {"create": "peer: psycopg INSERT", "read": "peer: psycopg SELECT by primary key"}

Create = Callable[[], Awaitable[Any]]  # makes a row, returns its id
Read = Callable[[Any], Awaitable[None]]


async def load(
    clients: list[tuple[Create, Read]], args: argparse.Namespace, duration_s: float
) -> tuple[dict[str, list[float]], Counter[str]]:
    """Every client creates or reads in a loop; latencies of the measured window per kind, and all errors."""
    start = time.monotonic() + args.warmup
    end = start + duration_s
    latencies: dict[str, list[float]] = {"create": [], "read": []}
    errors: Counter[str] = Counter()
    ids: list[Any] = []

    async def client(create: Create, read: Read, rng: random.Random) -> None:
        while (began := time.monotonic()) < end:
            kind = "create" if not ids or rng.random() < args.post_ratio else "read"
            try:
                if kind == "create":
                    ids.append(await create())
                else:
                    await read(rng.choice(ids))
            except Exception as exc:
                errors[f"{kind}: {type(exc).__name__}: {str(exc)[:80]}"] += 1
                continue
            if began >= start:
                latencies[kind].append(time.monotonic() - began)

    await asyncio.gather(*(client(c, r, random.Random(args.seed + n)) for n, (c, r) in enumerate(clients)))
    return latencies, errors


async def api_phase(url: str, token: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], Counter[str]]:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=10) as http:

        async def create() -> Any:
            response = await http.post("/v1/jobs", json=JOB)
            response.raise_for_status()
            return response.json()["id"]

        async def read(job_id: Any) -> None:
            (await http.get(f"/v1/jobs/{job_id}")).raise_for_status()

        return await load([(create, read)] * args.concurrency, args, args.duration)


def peer_client(conn: psycopg.AsyncConnection[Any]) -> tuple[Create, Read]:
    spec = json.dumps(JOB, sort_keys=True)
    digest = hashlib.sha256(spec.encode()).hexdigest()

    async def create() -> Any:
        cursor = await conn.execute(PEER_INSERT, (uuid.uuid4(), JOB["name"], Jsonb(JOB), Jsonb({}), digest))
        row = await cursor.fetchone()
        return row[0] if row else None

    async def read(row_id: Any) -> None:
        if await (await conn.execute(PEER_SELECT, (row_id,))).fetchone() is None:
            raise LookupError(f"peer row {row_id} is missing")

    return create, read


async def peer_phase(database_url: str, args: argparse.Namespace) -> tuple[dict[str, list[float]], Counter[str]]:
    connect = psycopg.AsyncConnection.connect
    conns = [await connect(database_url, autocommit=True, connect_timeout=10) for _ in range(args.concurrency)]
    try:
        return await load([peer_client(conn) for conn in conns], args, args.peer_duration)
    finally:
        for conn in conns:
            await conn.close()


def rows(
    names: dict[str, str], measured: tuple[dict[str, list[float]], Counter[str]], duration_s: float
) -> list[dict[str, Any]]:
    latencies, errors = measured
    failed = {kind: sum(n for error, n in errors.items() if error.startswith(kind)) for kind in names}
    return [
        {
            "path": names[kind],
            "requests": len(latencies[kind]) + failed[kind],
            "errors": failed[kind],
            "req_per_s": len(latencies[kind]) / duration_s,
            **ms(latencies[kind], 50, 99),
        }
        for kind in ("create", "read")
    ]


def main() -> int:
    p = parser(__doc__, database=True)
    p.add_argument("--concurrency", type=int, default=8, help="concurrent clients")
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds against the API")
    p.add_argument("--peer-duration", type=float, default=10.0, help="measured seconds against the peer")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each phase")
    p.add_argument("--post-ratio", type=float, default=0.5, help="share of creates in the mix")
    p.add_argument("--seed", type=int, default=1, help="seed of the mix")
    args = p.parse_args()
    with run("api_load", args) as record, scratch_database(args.database_url) as database_url:
        record.read_postgres(database_url)
        token = migrate_and_token(database_url)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(PEER_TABLE)
        with api_process(database_url) as api:
            print(f"API: {args.concurrency} clients for {args.warmup:g} + {args.duration:g} s", flush=True)
            api_rows = rows(API_PATHS, asyncio.run(api_phase(api.url, token, args)), args.duration)
        print(f"peer: {args.concurrency} psycopg clients for {args.warmup:g} + {args.peer_duration:g} s", flush=True)
        peer_rows = rows(PEER_PATHS, asyncio.run(peer_phase(database_url, args)), args.peer_duration)
        record.tables["latency"] = api_rows + peer_rows
        for api_row, peer_row in zip(api_rows, peer_rows, strict=True):
            for pct in ("p50_ms", "p99_ms"):
                record.ratio(
                    f"{api_row['path']}, {pct.replace('_', ' ')}", api_row[pct], peer_row["path"], peer_row[pct]
                )
        record.valid = not any(row["errors"] for row in record.tables["latency"])
    return 0 if record.valid else 1


if __name__ == "__main__":
    sys.exit(main())
