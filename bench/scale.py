"""Scale: admission cycles at 100, 1,000 and 10,000 queued jobs on a simulated cluster of 1,000 nodes;
API reads at 1,000 and 1,000,000 job rows; metrics at 10,000,000 points; logs at 1 GB. Each figure is
set against the same figure at a small size, measured in the same run: the growth ratio is the figure.

It measures the dispatcher's own code: the admission section imports `api.dispatcher` and runs
`Dispatcher.admit_round` (claim, placement, attempt rows, job tokens, submit) against a real PostgreSQL
database and `SimRay` (bench/scale_cluster.py), an in-memory Ray of `--nodes` nodes x 8 GPUs x 96 CPUs.
For each queue depth: the jobs table is emptied and filled with that many queued jobs over 50 projects
(mixed priorities and gangs from 1 GPU to 16 x 8 GPUs) and vacuumed (as autovacuum keeps it); rounds
run until one admits nothing (the cluster is full), then `--finish-rounds` rounds each follow 5% of the
running jobs ending. Before the rounds the process freezes its heap, as `trainmaster dispatcher` does
once it is up (`api.dispatcher.service.freeze_heap`).

The rest runs against `trainmaster api` (one worker) on the same scratch database, reached over HTTP
with a project token, `--requests` sequential requests per figure after 10 unmeasured:
- jobs: GET /v1/jobs (first page; a page deep in the list by cursor; `status=failed`; `status=queued`)
  and GET /v1/jobs/{id} of the newest queued job (its queue position is the last), at 1,000 rows and
  after growing to `--jobs` rows (1% queued, the token's project holding half of them); CHECKPOINT and
  VACUUM ANALYZE after each bulk insert, as a system in steady state would have had.
- metrics: ingest (4 senders, batches of 1,000 points, `--ingest-points`) into an empty table and again
  with 1,000,000 points stored; GET /v1/jobs/{id}/metrics?max_points=1000 of one job of `--points`
  points over 20 names against the same read of a job of 10,000 points; ingest while retention purges
  a finished job of 1,000,000 points against ingest alone.
- logs: a job of `--log-bytes` of lines: `?tail=100` and the SSE stream resumed with Last-Event-ID 100
  lines before the end (time to the first event), against the same on a job of 1,000 lines.
Bulk rows are written with INSERT ... SELECT generate_series (the triggers run as for any insert).

    .venv/bin/python bench/scale.py [--nodes 1000] [--depths 100 1000 10000] [--jobs 1000000]
        [--points 10000000] [--log-bytes 1000000000] [--scale 1.0]
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
from common import api_process, ms, parser, run, scratch_database
from scale_cluster import SimRay, admission_cycles, fill_queue

from api.auth import admin
from api.db import migrate
from api.db.session import create_engine, session_factory
from api.dispatcher.service import Dispatcher
from api.jobs.service import encode_cursor
from api.retention.service import purge_round
from api.settings import Settings

SPEC = '{"name": "bulk", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 1}}'
NAMES = [f"metric_{i:02d}" for i in range(20)]


def sql(url: str, statement: str, params: Any = None) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


# --------------------------------------------------------------------------- admission


async def cycles(settings: Settings, ray: SimRay, url: str, args: Any) -> dict[str, Any]:
    engine = create_engine(settings)
    try:
        dispatcher = Dispatcher(settings=settings, sessions=session_factory(engine), ray=ray, owner="bench")
        return await admission_cycles(dispatcher, ray, url, args.finish_rounds, random.Random(1))
    finally:
        await engine.dispose()


def admission(url: str, args: Any, record: Any) -> None:
    rows = []
    for depth in args.depths:
        ray = SimRay(args.nodes)
        ray.specs = fill_queue(url, depth, 50, random.Random(depth))
        settings = Settings(
            database_url=url, storage_path="s3://bench", admit_batch=args.admit_batch, db_connect_timeout_s=60
        )

        print(f"admission at {depth} queued on {args.nodes} nodes", flush=True)
        rows.append({"queued": depth, "nodes": args.nodes, **asyncio.run(cycles(settings, ray, url, args))})
    record.tables["admission rounds (Dispatcher.admit_round, admit_batch per round)"] = rows
    small, large = rows[0], rows[-1]
    record.ratio(
        f"admission round p99 at {large['queued']:,} queued, ms",
        large["p99_ms"],
        f"at {small['queued']:,} queued",
        small["p99_ms"],
    )
    record.ratio(
        f"jobs admitted/s at {large['queued']:,} queued",
        large["jobs_admitted_per_s"],
        f"at {small['queued']:,} queued",
        small["jobs_admitted_per_s"],
    )


# --------------------------------------------------------------------------- jobs


def add_jobs(url: str, bench: uuid.UUID, others: list[uuid.UUID], total: int) -> None:
    """Grow the jobs table to `total` rows, oldest first: 1% queued, the rest finished."""
    have = sql(url, "SELECT count(*) FROM jobs")[0][0]
    chunk = 100_000
    for start in range(have, total, chunk):
        sql(
            url,
            """INSERT INTO jobs (id, project_id, name, status, spec, priority, gang_cpus, gang_gpus,
                                 created_at, finished_at)
               SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN %(bench)s ELSE (%(others)s::uuid[])[1 + g %% 49] END,
                      'bulk-' || g,
                      (CASE WHEN g %% 100 = 0 THEN 'queued' WHEN g %% 50 = 1 THEN 'failed'
                            WHEN g %% 20 = 3 THEN 'cancelled' ELSE 'succeeded' END)::job_status,
                      %(spec)s::jsonb, (g %% 3) - 1, 1, g %% 5, now() - make_interval(secs => %(total)s::int - g),
                      CASE WHEN g %% 100 = 0 THEN NULL ELSE now() - make_interval(secs => %(total)s::int - g - 60) END
               FROM generate_series(%(lo)s::int, %(hi)s::int) g""",
            {
                "bench": bench,
                "others": others,
                "spec": SPEC,
                "total": total,
                "lo": start + 1,
                "hi": min(start + chunk, total),
            },
        )
    settle(url, "jobs")


def timed_gets(client: httpx.Client, path: str, params: dict[str, Any], n: int) -> list[float]:
    durations = []
    for i in range(n + 10):
        began = time.perf_counter()
        response = client.get(path, params=params)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")
        if i >= 10:
            durations.append(time.perf_counter() - began)
    return durations


def job_reads(url: str, client: httpx.Client, bench: uuid.UUID, requests: int) -> dict[str, dict[str, float]]:
    rows = sql(url, "SELECT count(*) FROM jobs WHERE project_id = %s", (bench,))[0][0]
    deep = sql(
        url,
        "SELECT created_at, id FROM jobs WHERE project_id = %s ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1",
        (bench, rows // 2),
    )[0]
    newest = sql(
        url,
        "SELECT id FROM jobs WHERE project_id = %s AND status = 'queued' ORDER BY created_at DESC LIMIT 1",
        (bench,),
    )[0][0]
    cursor = encode_cursor(SimpleNamespace(created_at=deep[0], id=deep[1]))  # type: ignore[arg-type]
    figures: dict[str, tuple[str, dict[str, Any]]] = {
        "GET /v1/jobs first page": ("/v1/jobs", {"limit": 50}),
        "GET /v1/jobs deep cursor page": ("/v1/jobs", {"limit": 50, "cursor": cursor}),
        "GET /v1/jobs?status=failed": ("/v1/jobs", {"limit": 50, "status": "failed"}),
        "GET /v1/jobs?status=queued": ("/v1/jobs", {"limit": 50, "status": "queued"}),
        "GET /v1/jobs/{id} newest queued, with position": (f"/v1/jobs/{newest}", {}),
    }
    return {name: ms(timed_gets(client, path, params, requests), 50, 99) for name, (path, params) in figures.items()}


def jobs_section(url: str, api_url: str, token: str, args: Any, record: Any) -> None:
    bench = sql(url, "SELECT id FROM projects WHERE name = 'bench'")[0][0]
    others = [row[0] for row in sql(url, "SELECT id FROM projects WHERE name LIKE 'p%' ORDER BY name LIMIT 49")]
    headers = {"Authorization": f"Bearer {token}"}
    results = {}
    with httpx.Client(base_url=api_url, headers=headers, timeout=60) as client:
        for total in (1000, args.jobs):
            print(f"jobs: {total:,} rows", flush=True)
            add_jobs(url, bench, others, total)
            results[total] = job_reads(url, client, bench, args.requests)
    table = []
    for name in results[1000]:
        small, large = results[1000][name], results[args.jobs][name]
        table.append({"read": name, "rows": 1000, **small})
        table.append({"read": name, "rows": args.jobs, **large})
        record.ratio(f"{name} p50 at {args.jobs:,} rows, ms", large["p50_ms"], "at 1,000 rows", small["p50_ms"])
        record.ratio(f"{name} p99 at {args.jobs:,} rows, ms", large["p99_ms"], "at 1,000 rows", small["p99_ms"])
    record.tables["job reads (sequential, one API worker)"] = table


# --------------------------------------------------------------------------- metrics


def new_job(url: str, bench: uuid.UUID, status: str = "running") -> str:
    return str(
        sql(
            url,
            "INSERT INTO jobs (id, project_id, name, status, spec) VALUES (gen_random_uuid(), %s, 'scale',"
            " %s::job_status, %s::jsonb) RETURNING id",
            (bench, status, SPEC),
        )[0][0]
    )


def add_points(url: str, job_id: str, have: int, total: int) -> None:
    """Points `have`+1..`total` of a job, 20 names in turn, one step per 20 points, two ranks."""
    chunk = 500_000
    for start in range(have, total, chunk):
        sql(
            url,
            "INSERT INTO metric_points (job_id, rank, step, name, value)"
            " SELECT %s, (g / 20) %% 2, g / 20, (%s::text[])[1 + g %% 20], sin(g / 1000.0) + random() / 10"
            " FROM generate_series(%s::int, %s::int) g ORDER BY g",
            (job_id, NAMES, start + 1, min(start + chunk, total)),
        )


async def ingest_rate(api_url: str, token: str, job_id: str, points: int, senders: int = 4) -> dict[str, float]:
    """Points per second through POST /v1/jobs/{id}/metrics, `senders` concurrent batches of 1,000, and
    the batches' latency (a batch that waited on a lock would stand out at p99 and max)."""
    batches = iter(range(points // 1000))
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=120) as client:

        async def sender() -> None:
            for index in batches:
                body = {
                    "batch_id": str(uuid.uuid4()),
                    "points": [
                        {"step": index * 1000 + i, "values": {"loss": 1.0 / (i + 1)}, "rank": 0} for i in range(1000)
                    ],
                }
                sent = time.perf_counter()
                response = await client.post(f"/v1/jobs/{job_id}/metrics", json=body)
                latencies.append(time.perf_counter() - sent)
                if response.status_code != 201:
                    raise RuntimeError(f"ingest: {response.status_code} {response.text[:300]}")

        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        rate = (points // 1000) * 1000 / (time.perf_counter() - began)
        return {"points_per_s": rate, **ms(latencies, 50, 99), "max_ms": max(latencies) * 1000}


def settle(url: str, table: str) -> None:
    """After a bulk load: flush it and vacuum, as a system in steady state would have."""
    sql(url, "CHECKPOINT")
    sql(url, f"VACUUM ANALYZE {table}")


def purge_in_background(url: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Retention's own purge round (batches of 5,000 rows) in a thread of its own."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        async def go() -> None:
            engine = create_engine(Settings(database_url=url, db_connect_timeout_s=60))
            try:
                began = time.perf_counter()
                purged = await purge_round(session_factory(engine), days=1, batch=5000)
                outcome.update(rows=purged.rows, transactions=purged.transactions, seconds=time.perf_counter() - began)
            finally:
                await engine.dispose()

        asyncio.run(go())

    thread = threading.Thread(target=work, name="retention")
    thread.start()
    return thread, outcome


def metrics_section(url: str, api_url: str, token: str, args: Any, record: Any) -> None:
    bench = sql(url, "SELECT id FROM projects WHERE name = 'bench'")[0][0]
    headers = {"Authorization": f"Bearer {token}"}
    print("metrics: ingest into an empty table", flush=True)
    empty = asyncio.run(ingest_rate(api_url, token, new_job(url, bench), args.ingest_points))
    big = new_job(url, bench)
    add_points(url, big, 0, 1_000_000)
    settle(url, "metric_points")
    print("metrics: ingest with 1,000,000 points stored", flush=True)
    stored = asyncio.run(ingest_rate(api_url, token, new_job(url, bench), args.ingest_points))
    record.tables["ingest (4 senders, batches of 1,000 points)"] = [
        {"points stored before": 0, **empty},
        {"points stored before": 1_000_000, **stored},
    ]
    record.ratio(
        "ingest points/s with 1,000,000 stored", stored["points_per_s"], "into an empty table", empty["points_per_s"]
    )

    small = new_job(url, bench)
    add_points(url, small, 0, 10_000)
    print(f"metrics: growing one job to {args.points:,} points", flush=True)
    add_points(url, big, 1_000_000, args.points)
    settle(url, "metric_points")
    settle(url, "metric_blocks")
    with httpx.Client(base_url=api_url, headers=headers, timeout=120) as client:
        reads = {
            size: ms(timed_gets(client, f"/v1/jobs/{job}/metrics", {"max_points": 1000}, args.requests), 50, 99)
            for size, job in ((10_000, small), (args.points, big))
        }
        returned = len(client.get(f"/v1/jobs/{big}/metrics", params={"max_points": 1000}).json()["items"])
    record.tables["downsampled metric reads (max_points=1000, 20 names)"] = [
        {"points": size, "points_returned": returned if size == args.points else None, **figures}
        for size, figures in reads.items()
    ]
    for pct in ("p50_ms", "p99_ms"):
        record.ratio(
            f"GET metrics?max_points=1000 {pct[:3]} at {args.points:,} points, ms",
            reads[args.points][pct],
            "at 10,000 points",
            reads[10_000][pct],
        )

    finished = new_job(url, bench)
    add_points(url, finished, 0, 1_000_000)
    sql(
        url, "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '30 days' WHERE id = %s", (finished,)
    )
    settle(url, "metric_points")
    alone = asyncio.run(ingest_rate(api_url, token, new_job(url, bench), args.ingest_points))
    print("metrics: ingest while retention purges 1,000,000 points", flush=True)
    thread, outcome = purge_in_background(url)
    during = asyncio.run(ingest_rate(api_url, token, new_job(url, bench), args.ingest_points))
    purging_at_end = thread.is_alive()
    thread.join()
    record.tables["ingest while retention purges 1,000,000 points of a finished job"] = [
        {"ingest": "alone", **alone},
        {"ingest": "during the purge", **during, "purge still running at the end": purging_at_end},
    ]
    record.tables["the purge"] = [outcome]
    record.ratio(
        "ingest points/s while retention purges", during["points_per_s"], "ingest alone", alone["points_per_s"]
    )
    record.ratio("ingest batch p99 while retention purges, ms", during["p99_ms"], "ingest alone", alone["p99_ms"])


# --------------------------------------------------------------------------- logs


def add_lines(url: str, job_id: str, count: int, width: int) -> None:
    chunk = 500_000
    for start in range(0, count, chunk):
        sql(
            url,
            "INSERT INTO log_lines (job_id, attempt, source, line)"
            " SELECT %s, 1, 'worker-' || (g %% 8), lpad(g::text, %s, 'x')"
            " FROM generate_series(%s::int, %s::int) g ORDER BY g",
            (job_id, width, start + 1, min(start + chunk, count)),
        )


def resume_latency(client: httpx.Client, job_id: str, after: int) -> float:
    began = time.perf_counter()
    headers = {"Last-Event-ID": str(after)}
    with client.stream("GET", f"/v1/jobs/{job_id}/logs/stream", headers=headers) as response:
        for line in response.iter_lines():
            if line.startswith("event: logs"):
                return time.perf_counter() - began
    raise RuntimeError("the stream ended without a logs event")


def logs_section(url: str, api_url: str, token: str, args: Any, record: Any) -> None:
    bench = sql(url, "SELECT id FROM projects WHERE name = 'bench'")[0][0]
    width = 120
    jobs = {1000: new_job(url, bench), args.log_bytes // width: new_job(url, bench)}
    for count, job in jobs.items():
        print(f"logs: {count:,} lines of {width} characters", flush=True)
        add_lines(url, job, count, width)
    sql(url, "ANALYZE log_lines")
    table = []
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
        for count, job in jobs.items():
            last = sql(url, "SELECT max(seq) FROM log_lines WHERE job_id = %s", (job,))[0][0]
            tail = ms(timed_gets(client, f"/v1/jobs/{job}/logs", {"tail": 100}, args.requests), 50, 99)
            resumes = [resume_latency(client, job, last - 100) for _ in range(min(args.requests, 30))]
            table.append(
                {"lines": count, "bytes": count * width, "tail_100": tail, "stream_resume": ms(resumes, 50, 99)}
            )
    record.tables["logs (one job)"] = table
    small, large = table
    for figure in ("tail_100", "stream_resume"):
        record.ratio(
            f"logs {figure.replace('_', ' ')} p50 at {large['bytes'] / 1e9:.2g} GB, ms",
            large[figure]["p50_ms"],
            "at 1,000 lines",
            small[figure]["p50_ms"],
        )


# --------------------------------------------------------------------------- the run


def main() -> None:
    p = parser(__doc__, database=True)
    p.add_argument("--nodes", type=int, default=1000, help="simulated Ray nodes (8 GPUs, 96 CPUs each)")
    p.add_argument("--depths", type=int, nargs="+", default=[100, 1000, 10_000], help="queue depths")
    p.add_argument("--admit-batch", type=int, default=50, help="queued jobs considered per round (the setting)")
    p.add_argument("--finish-rounds", type=int, default=20, help="rounds after the cluster is full")
    p.add_argument("--jobs", type=int, default=1_000_000, help="job rows for the API reads")
    p.add_argument("--points", type=int, default=10_000_000, help="points of the big metrics job")
    p.add_argument("--ingest-points", type=int, default=200_000, help="points per ingest measurement")
    p.add_argument("--log-bytes", type=int, default=1_000_000_000, help="log bytes of the big logs job")
    p.add_argument("--requests", type=int, default=100, help="measured requests per read figure")
    p.add_argument("--sections", nargs="+", default=["admission", "jobs", "metrics", "logs"])
    args = p.parse_args()
    os.environ.setdefault("TRAINMASTER_DB_CONNECT_TIMEOUT_S", "60")  # the API's, on a busy machine
    with run("scale", args) as record, scratch_database(args.database_url) as url:
        record.read_postgres(url)
        migrate.upgrade(url)
        if "admission" in args.sections:
            admission(url, args, record)
        sql(url, "TRUNCATE projects CASCADE")
        token = admin.project_token(url, "bench")
        sql(url, "INSERT INTO projects (id, name) SELECT gen_random_uuid(), 'p' || g FROM generate_series(1, 49) g")
        with api_process(url) as api:
            for name, section in (("jobs", jobs_section), ("metrics", metrics_section), ("logs", logs_section)):
                if name in args.sections:
                    section(url, api.url, token, args, record)
        size = sql(url, "SELECT pg_database_size(current_database())")[0][0]
        record.facts["database_bytes_at_end"] = size


if __name__ == "__main__":
    main()
