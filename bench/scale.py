"""Scale: each figure at a large size against the same figure at a small size, in the same run (the
ratio is the growth), on a scratch database. Sections (`--sections`):

- admission: the dispatcher's own `Dispatcher.admit_round` against `SimRay` (an in-memory Ray of
  `--nodes` nodes x 8 GPUs x 96 CPUs) at each of `--depths` queued jobs (50 projects, mixed priorities
  and gangs, vacuumed): rounds until one admits nothing, then `--finish-rounds` rounds each after 5% of
  the running jobs end; and the same queue with 100 launches that fail (a damaged code package) against
  it clean. quotas: 15,000 queued over 30 projects in 3 cohorts under quota, against no quotas.
- jobs, usage, checkpoints, metrics and logs go through `trainmaster api` (one worker), `--requests`
  sequential requests per figure after 10 unmeasured: job pages and one job at 1,000 and `--jobs` rows;
  usage over a year of attempts against scanning them; a checkpoint collector pass against counting
  the live ones; metric ingest into an empty table against with 1,000,000 points stored and during a
  retention purge; downsampled reads of `--points` points against 10,000; logs tail and stream resume
  at `--log-bytes` against 1,000 lines.
Bulk rows come from INSERT ... SELECT generate_series, then CHECKPOINT and VACUUM ANALYZE, as a system
in steady state would have had them.

    .venv/bin/python bench/scale.py [--nodes 1000] [--depths 100 1000 10000] [--jobs 1000000]
        [--points 10000000] [--log-bytes 1000000000] [--sections admission quotas jobs usage checkpoints metrics logs]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import math
import os
import random
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
from harness import Record, api_process, ms, parse_args, run, scratch_database, timed
from ingest import api_batches, metric_bodies
from psycopg.types.json import Jsonb
from sqlalchemy import text

from api.auth import admin
from api.auth.principal import Scope
from api.db.session import create_engine, session_factory
from api.dispatcher.backend import GangState, Launch, RayJobInfo, RayJobState
from api.dispatcher.placement import ClusterCapacity, Decision, Node, Resources, admit
from api.dispatcher.service import Dispatcher
from api.jobs.service import encode_cursor
from api.ops.heap import freeze_startup_heap
from api.retention.service import purge_round
from api.settings import Settings
from trainmaster.models import JobSpec

SPEC = '{"name": "bulk", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 1}}'
NAMES = [f"metric_{i:02d}" for i in range(20)]
JOBS = """INSERT INTO jobs (id, project_id, name, status, spec, priority, gang_cpus, gang_gpus, created_at, finished_at)
    SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN %(bench)s ELSE (%(others)s::uuid[])[1 + g %% 49] END,
           'bulk-' || g,
           (CASE WHEN g %% 100 = 0 THEN 'queued' WHEN g %% 50 = 1 THEN 'failed'
                 WHEN g %% 20 = 3 THEN 'cancelled' ELSE 'succeeded' END)::job_status,
           %(spec)s::jsonb, (g %% 3) - 1, 1, g %% 5, now() - make_interval(secs => %(total)s::int - g),
           CASE WHEN g %% 100 = 0 THEN NULL ELSE now() - make_interval(secs => %(total)s::int - g - 60) END
    FROM generate_series(%(lo)s::int, %(hi)s::int) g"""
POINTS = """INSERT INTO metric_points (job_id, rank, step, name, value)
    SELECT %s, (g / 20) %% 2, g / 20, (%s::text[])[1 + g %% 20], sin(g / 1000.0) + random() / 10
    FROM generate_series(%s::int, %s::int) g ORDER BY g"""
LINES = """INSERT INTO log_lines (job_id, attempt, source, line)
    SELECT %s, 1, 'worker-' || (g %% 8), lpad(g::text, %s, 'x') FROM generate_series(%s::int, %s::int) g ORDER BY g"""


def sql(url: str, statement: str, params: Any = None) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def bulk(url: str, statement: str, last: int, *params: Any, first: int = 1) -> None:
    """`statement` for rows first..last (its last two parameters), 500,000 rows at a time."""
    for lo in range(first, last + 1, 500_000):
        sql(url, statement, (*params, lo, min(lo + 499_999, last)))


def settle(url: str, *tables: str) -> None:
    """After a bulk load: flush it and vacuum, as a system in steady state would have."""
    sql(url, "CHECKPOINT")
    for table in tables:
        sql(url, f"VACUUM ANALYZE {table}")


def new_job(url: str, project: uuid.UUID, points: int = 0) -> str:
    """A running job of `project`, with `points` metric points (20 names) stored."""
    insert = "INSERT INTO jobs (id, project_id, name, status, spec) VALUES (gen_random_uuid(), %s, 'scale', 'running',"
    job = str(sql(url, insert + " %s::jsonb) RETURNING id", (project, SPEC))[0][0])
    bulk(url, POINTS, points, job, NAMES)
    return job


def reads(client: httpx.Client, path: str, params: dict[str, Any], count: int) -> dict[str, float]:
    """p50 and p99 of `count` sequential GETs, after 10 unmeasured."""

    def get() -> None:
        response = client.get(path, params=params)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")

    return ms(timed(get, count, warmup=10), 50, 99)


# --------------------------------------------------------------------------- the simulated cluster

NODE = {"CPU": 96.0, "GPU": 8.0}
# (share of jobs, workers, resources per worker, strategy): an organisation's mix, ~12 GPUs a job.
GANGS: tuple[tuple[float, int, dict[str, float], str], ...] = (
    (0.25, 1, {"CPU": 8, "GPU": 1}, "PACK"),
    (0.15, 1, {"CPU": 32, "GPU": 4}, "PACK"),
    (0.15, 1, {"CPU": 90, "GPU": 8}, "STRICT_PACK"),
    (0.15, 2, {"CPU": 90, "GPU": 8}, "SPREAD"),
    (0.10, 4, {"CPU": 90, "GPU": 8}, "PACK"),
    (0.04, 8, {"CPU": 90, "GPU": 8}, "PACK"),
    (0.01, 16, {"CPU": 90, "GPU": 8}, "STRICT_SPREAD"),
    (0.15, 4, {"CPU": 16}, "SPREAD"),
)
PRIORITIES = (-10, 0, 0, 0, 0, 5, 10)


class SimRay:
    """An in-memory Ray of many nodes (tests/factories/ray.py's FakeRay grown to scale): `submit` places
    the gang as a placement group would (the dispatcher's own `placement.admit`) and takes its resources;
    `finish` gives them back."""

    def __init__(self, nodes: int) -> None:
        self.free = [Node(f"node{i:05d}", dict(NODE), dict(NODE), f"10.0.{i // 250}.{i % 250}") for i in range(nodes)]
        self.specs: dict[str, JobSpec] = {}  # job id -> spec, for placing its gang
        self.placed: dict[str, dict[str, list[Resources]]] = {}  # job id -> node -> bundles
        self.view: ClusterCapacity | None = None  # the nodes as placement sees them between finishes (see submit)

    def cluster(self) -> ClusterCapacity:
        return ClusterCapacity([Node(n.node_id, dict(n.total), dict(n.free), n.ip) for n in self.free])

    def submit(self, launch: Launch) -> bool:
        """Place the gang as Ray would. One `ClusterCapacity` view of the nodes is kept between submits (what
        placement remembers stays true while resources are only taken), so the simulator's own cost
        per submit stays small beside the dispatcher's; `finish` drops it."""
        job_id = launch.metadata["trainmaster_job_id"]
        self.view = self.view or ClusterCapacity(self.free)
        admission = admit(self.specs[job_id], self.view, {})
        if admission.decision is Decision.admit:
            self.view.reserve(admission.placement)
            self.placed[job_id] = admission.placement
        return True

    def finish(self, job_id: str) -> None:
        self.view = None  # resources come back: what placement remembered no longer holds
        by_id = {node.node_id: node for node in self.free}
        for node_id, bundles in self.placed.pop(job_id, {}).items():
            for bundle in bundles:
                for name, amount in bundle.items():
                    by_id[node_id].free[name] = by_id[node_id].free.get(name, 0.0) + amount

    def info(self, submission_id: str) -> RayJobInfo | None:
        return RayJobInfo(RayJobState.RUNNING)

    def stop(self, submission_id: str) -> None:
        pass

    def gang_state(self, driver_job_id: str) -> GangState:
        return GangState(placed=True)

    def logs(self, submission_id: str, offset: int = 0, final: bool = False) -> str:
        return ""


def broken_package() -> tuple[str, bytes]:
    """A code package whose member data was damaged after the upload, and its id: the launch of a job
    naming it fails (archive.BadPackage), and with containment that job's alone."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.py", b"print('never unpacked')\n" * 8)
    content = bytearray(buffer.getvalue())
    content[content.index(b"print")] ^= 0xFF
    return f"sha256:{hashlib.sha256(content).hexdigest()}", bytes(content)


def fill_queue(database_url: str, count: int, projects: int, rng: random.Random, broken: int = 0) -> dict[str, JobSpec]:
    """Empty jobs, then `count` queued ones over `projects` projects (mixed gangs and priorities, one
    second apart in age); their specs by id. The first `broken` (of the same draw, so the rest is the
    queue a clean run gets) name a code package that cannot be unpacked."""
    code_id, content = broken_package()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs CASCADE")
        conn.execute(
            "INSERT INTO projects (id, name, cluster_id) SELECT gen_random_uuid(), 'p' || g,"
            " (SELECT id FROM clusters WHERE name = 'default') FROM generate_series(1, %s) g"
            " ON CONFLICT (name) DO NOTHING",
            (projects,),
        )
        project_ids = [row[0] for row in conn.execute("SELECT id FROM projects WHERE name LIKE 'p%'").fetchall()]
        conn.execute(
            "INSERT INTO code_packages (project_id, id, size, file_count, content)"
            " SELECT p, %s, %s, 1, %s FROM unnest(%s::uuid[]) p ON CONFLICT DO NOTHING",
            (code_id, len(content), content, project_ids),
        )
        rows, specs = [], {}
        for i in range(count):
            _, workers, per_worker, strategy = rng.choices(GANGS, [g[0] for g in GANGS])[0]
            scaling = {"num_workers": workers, "resources_per_worker": per_worker, "placement_strategy": strategy}
            body = {"name": f"scale-{i}", "entrypoint": "builtin:mlp", "scaling": scaling} | (
                {"code": code_id} if i < broken else {}
            )
            spec = JobSpec.model_validate(body | {"priority": rng.choice(PRIORITIES)})
            gang = {name: amount * workers for name, amount in spec.scaling.worker_resources().items()}
            job_id = uuid.uuid4()
            specs[str(job_id)] = spec
            row = (job_id, rng.choice(project_ids), spec.name, Jsonb(spec.model_dump(mode="json")), spec.priority)
            rows.append((*row, gang.get("CPU", 0.0), gang.get("GPU", 0.0), count - i))
        conn.cursor().executemany(
            "INSERT INTO jobs (id, project_id, name, status, spec, priority, gang_cpus, gang_gpus, created_at)"
            " VALUES (%s, %s, %s, 'queued', %s, %s, %s, %s, now() - make_interval(secs => %s))",
            rows,
        )
        # As autovacuum leaves the table in steady state (migration 0007: after 1,000 changed rows), the
        # claim's per-project reads of ix_jobs_queued_by_project are index-only.
        conn.execute("VACUUM ANALYZE jobs")
    return specs


async def admission_cycles(settings: Settings, ray: SimRay, finish_rounds: int, rng: random.Random) -> dict[str, Any]:
    """A dispatcher's rounds until one admits nothing (the cluster is full or the queue empty), then rounds
    that each follow 5% of the running jobs ending (succeeded, as reconcile would record it). Time per
    round and jobs admitted per second."""
    engine = create_engine(settings)
    durations: list[float] = []
    try:
        dispatcher = Dispatcher(settings=settings, sessions=session_factory(engine), ray=ray, owner="bench")
        async with dispatcher.sessions() as session:  # a warm connection, as a running dispatcher has
            await session.execute(text("SELECT 1"))
        # As `trainmaster dispatcher` does once it is up: what the process holds by now (here also this
        # script's queue of specs, which a dispatcher never holds) is out of the collector's way.
        freeze_startup_heap()

        async def one() -> int:
            began = time.perf_counter()
            count = await dispatcher.admit_round()
            durations.append(time.perf_counter() - began)
            return count

        admitted = filled_in = 0
        while (count := await one()) > 0:
            admitted, filled_in = admitted + count, filled_in + 1
        full = sum(node.total["GPU"] - node.free["GPU"] for node in ray.free)
        for _ in range(finish_rounds):
            ending = rng.sample(sorted(ray.placed), max(1, int(len(ray.placed) * 0.05))) if ray.placed else []
            with psycopg.connect(settings.database_url, autocommit=True) as conn:
                finished = "UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = ANY(%s::uuid[])"
                conn.execute(finished, (ending,))
            for job_id in ending:
                ray.finish(job_id)
            admitted += await one()
    finally:
        await engine.dispose()
    total_s = sum(durations) or math.inf
    return {
        **{"rounds": len(durations), "rounds_to_fill": filled_in, "gpus_used_when_full": full, "admitted": admitted},
        **{**ms(durations, 50, 99), "max_ms": max(durations) * 1000},
        # The first round of a process also compiles and prepares every statement (once per dispatcher).
        "p99_after_first_ms": ms(durations[1:], 99)["p99_ms"],
        **{"jobs_admitted_per_s": admitted / total_s, "rounds_per_s": len(durations) / total_s},
    }


# --------------------------------------------------------------------------- the sections


def best_of_3(variants: tuple[Any, ...], one: Callable[[Any], dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Three runs of each variant, in turn; each variant's best run by `key`."""
    runs: dict[Any, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for _ in range(3):
        for variant, rows in runs.items():
            rows.append(one(variant))
    return [max(rows, key=lambda row: row[key]) for rows in runs.values()]


def cycles(url: str, args: argparse.Namespace, row: dict[str, Any], projects: int = 50, **queue: Any) -> dict:
    """`row` and the figures of `admission_cycles` on a fresh `SimRay` of `--nodes`, after `fill_queue`
    of `row["queued"]` jobs over `projects` (seeded by the count, `queue`'s `broken` first); with `quota`
    (JSON), every project's nominal quota, in 3 cohorts."""
    ray = SimRay(args.nodes)
    ray.specs = fill_queue(url, row["queued"], projects, random.Random(row["queued"]), queue.get("broken", 0))
    if queue.get("quota"):
        sql(url, QUOTAS, (queue["quota"],))
    with tempfile.TemporaryDirectory(prefix="tmb-code-") as cache:  # a broken package is never unpacked there
        fixed: dict[str, Any] = {"storage_path": "s3://bench", "admit_batch": 50, "db_connect_timeout_s": 60}
        settings = Settings(database_url=url, code_cache_path=cache, **fixed)
        return row | asyncio.run(admission_cycles(settings, ray, args.finish_rounds, random.Random(1)))


def admission(url: str, args: argparse.Namespace, record: Record) -> None:
    rows = []
    for depth in args.depths:
        print(f"admission at {depth} queued on {args.nodes} nodes", flush=True)
        rows.append(cycles(url, args, {"queued": depth, "nodes": args.nodes}))
    record.tables["admission rounds (Dispatcher.admit_round, admit_batch per round)"] = rows
    small, large, at = rows[0], rows[-1], f"at {rows[0]['queued']:,} queued"
    record.ratio(f"admission round p99 at {large['queued']:,} queued, ms", large["p99_ms"], at, small["p99_ms"])
    rate = "jobs_admitted_per_s"
    record.ratio(f"jobs admitted/s at {large['queued']:,} queued", large[rate], at, small[rate])
    # Containment: the same queue with its first 100 jobs naming a code package that cannot be unpacked
    # (each fails alone, with the reason), against the queue as it is; the better of 3 runs of each.
    depth = args.depths[1] if len(args.depths) > 1 else args.depths[0]
    table = "admission rounds with 100 launches that fail in the queue, and without"
    clean, failing = record.tables[table] = best_of_3(
        (0, 100), lambda n: cycles(url, args, {"queued": depth, "failing_launches": n}, broken=n), "rounds_per_s"
    )
    figure = f"admission rounds/s at {depth:,} queued with 100 failing launches"
    record.ratio(figure, failing["rounds_per_s"], "with a clean queue", clean["rounds_per_s"])


QUOTAS = "UPDATE projects SET quota = %s::jsonb, cohort = 'c' || (substr(name, 2)::int %% 3) WHERE name LIKE 'p%%'"


def quotas(url: str, args: argparse.Namespace, record: Record) -> None:
    """Kueue's published baseline shape (15,000 workloads over 30 cluster queues): 15,000 queued over 30
    projects, each with a nominal quota of 1/30 of the cluster's GPUs and CPUs, in 3 cohorts of 10 that
    lend and borrow; against the same queue with no quota at all (the best of 3 runs of each)."""
    share = json.dumps({name: amount * args.nodes / 30 for name, amount in NODE.items()})

    def one(quota: bool) -> dict[str, Any]:
        sql(url, "TRUNCATE projects CASCADE")
        row = {"queued": args.quota_jobs, "projects": 30, "quotas": quota}
        return cycles(url, args, row, 30, quota=quota and share)

    free, quota = record.tables["admission with 30 projects in 3 cohorts under quota, and without quotas"] = best_of_3(
        (False, True), one, "jobs_admitted_per_s"
    )
    figure = f"jobs admitted/s at {args.quota_jobs:,} queued over 30 projects with quotas and cohorts"
    record.ratio(figure, quota["jobs_admitted_per_s"], "without quotas", free["jobs_admitted_per_s"])


def grow_jobs(url: str, bench: uuid.UUID, total: int) -> None:
    """The jobs table grown to `total` rows, oldest first: half the bench project's, 1% queued, the rest
    finished."""
    others = [row[0] for row in sql(url, "SELECT id FROM projects WHERE name LIKE 'p%' ORDER BY name LIMIT 49")]
    print(f"jobs: {total:,} rows", flush=True)
    have = sql(url, "SELECT count(*) FROM jobs")[0][0]
    fixed = {"bench": bench, "others": others, "spec": SPEC, "total": total}
    for lo in range(have + 1, total + 1, 100_000):
        sql(url, JOBS, fixed | {"lo": lo, "hi": min(lo + 99_999, total)})
    settle(url, "jobs")


def jobs(url: str, client: httpx.Client, bench: uuid.UUID, args: argparse.Namespace, record: Record) -> None:
    results: dict[int, dict[str, dict[str, float]]] = {}
    for total in (1000, args.jobs):
        grow_jobs(url, bench, total)
        rows = sql(url, "SELECT count(*) FROM jobs WHERE project_id = %s", (bench,))[0][0]
        deep = "SELECT created_at, id FROM jobs WHERE project_id = %s ORDER BY created_at DESC, id DESC OFFSET %s"
        created_at, deep_id = sql(url, deep + " LIMIT 1", (bench, rows // 2))[0]
        newest = "SELECT id FROM jobs WHERE project_id = %s AND status = 'queued' ORDER BY created_at DESC LIMIT 1"
        cursor = encode_cursor(SimpleNamespace(created_at=created_at, id=deep_id))  # type: ignore[arg-type]
        figures: dict[str, tuple[str, dict[str, Any]]] = {
            "GET /v1/jobs first page": ("/v1/jobs", {"limit": 50}),
            "GET /v1/jobs deep cursor page": ("/v1/jobs", {"limit": 50, "cursor": cursor}),
            "GET /v1/jobs?status=failed": ("/v1/jobs", {"limit": 50, "status": "failed"}),
            "GET /v1/jobs?status=queued": ("/v1/jobs", {"limit": 50, "status": "queued"}),
            "GET /v1/jobs/{id} newest queued, with position": (f"/v1/jobs/{sql(url, newest, (bench,))[0][0]}", {}),
        }
        results[total] = {name: reads(client, path, params, args.requests) for name, (path, params) in figures.items()}
    table = []
    for name, small in results[1000].items():
        large = results[args.jobs][name]
        table += [{"read": name, "rows": 1000, **small}, {"read": name, "rows": args.jobs, **large}]
        for pct in ("p50_ms", "p99_ms"):
            figure = f"{name} {pct[:3]} at {args.jobs:,} rows, ms"
            record.ratio(figure, large[pct], "at 1,000 rows", small[pct])
    record.tables["job reads (sequential, one API worker)"] = table


# One ended attempt per job over the past year, its seconds as the trigger of migration 0017 splits them;
# then the rollups that trigger would have summed (a bulk load: per-row triggers would take an hour here).
ATTEMPTS_YEAR = """
    INSERT INTO job_attempts (job_id, n, ray_submission_id, status, created_at, running_at, finished_at,
                              queue_s, starting_s, productive_s, lost_s)
    SELECT id, 1, 'tm-' || id || '-1', 'succeeded', e - make_interval(secs => 600), e - make_interval(secs => 570),
           e, 5, 30, 570, 0
    FROM (SELECT id, now() - make_interval(secs => (abs(hashtext(id::text)) % (365 * 86400))) AS e FROM jobs) j
"""
ROLLUP_YEAR = """
    INSERT INTO usage_{table}s (project_id, {table}, user_name, attempts, queue_s, cpu_starting_s, cpu_productive_s,
                             cpu_lost_s, gpu_starting_s, gpu_productive_s, gpu_lost_s)
    SELECT j.project_id, date_trunc('{table}', a.finished_at, 'UTC'), 'u' || (abs(hashtext(j.id::text)) % 3),
           count(*), sum(a.queue_s), sum(a.starting_s * j.gang_cpus), sum(a.productive_s * j.gang_cpus), 0,
           sum(a.starting_s * j.gang_gpus), sum(a.productive_s * j.gang_gpus), 0
    FROM job_attempts a JOIN jobs j ON j.id = a.job_id GROUP BY 1, 2, 3
"""
# The peer: the same per-project daily figures read from the attempts themselves.
SCAN_YEAR = """
    SELECT p.name, date_trunc('day', a.finished_at), count(*), sum(a.queue_s), sum(a.starting_s * j.gang_cpus),
           sum(a.productive_s * j.gang_cpus), sum(a.lost_s * j.gang_cpus), sum(a.starting_s * j.gang_gpus),
           sum(a.productive_s * j.gang_gpus), sum(a.lost_s * j.gang_gpus)
    FROM job_attempts a JOIN jobs j ON j.id = a.job_id JOIN projects p ON p.id = j.project_id
    WHERE a.finished_at >= now() - interval '365 days' GROUP BY 1, 2
"""


def usage(url: str, client: httpx.Client, bench: uuid.UUID, args: argparse.Namespace, record: Record) -> None:
    """GET /v1/usage over a year of `--jobs` ended attempts (50 projects, 3 users each), per project and
    day, as an admin reads it, against the same figures scanned from the attempts (direct SQL)."""
    grow_jobs(url, bench, args.jobs)
    print(f"usage: {args.jobs:,} attempts over a year", flush=True)
    sql(url, "DELETE FROM job_attempts")
    sql(url, "TRUNCATE usage_hours, usage_days")
    sql(url, ATTEMPTS_YEAR)
    for table in ("hour", "day"):
        sql(url, ROLLUP_YEAR.format(table=table))
    settle(url, "job_attempts", "usage_hours", "usage_days")
    rows = sql(url, "SELECT (SELECT count(*) FROM usage_hours) + (SELECT count(*) FROM usage_days)")[0][0]
    headers = {"Authorization": f"Bearer {admin.token(url, 'bench', scope=Scope.admin)}"}
    year = {"from": (datetime.now(UTC) - timedelta(days=365)).isoformat(), "granularity": "day"}
    with httpx.Client(base_url=client.base_url, headers=headers, timeout=120) as adm:
        api = reads(adm, "/v1/usage", year, args.requests)
    scan = ms(timed(lambda: sql(url, SCAN_YEAR), max(5, args.requests // 10), warmup=1), 50, 99)
    record.tables["usage over a year"] = [
        {"read": "GET /v1/usage per project and day (rollups)", "attempts": args.jobs, "rollup_rows": rows, **api},
        {"read": "scan of the attempts, direct SQL", "attempts": args.jobs, **scan},
    ]
    figure = f"GET /v1/usage per project and day over a year of {args.jobs:,} attempts p50, ms"
    record.ratio(figure, api["p50_ms"], "the same figures scanned from the attempts", scan["p50_ms"])


CHECKPOINTS = """INSERT INTO checkpoints (job_id, attempt, path, step, metrics)
    SELECT j.id, 1, '/storage/' || j.id || '/checkpoint_' || s, s, jsonb_build_object('acc', random())
    FROM (SELECT id FROM jobs ORDER BY created_at LIMIT %s) j, generate_series(1, %s) s"""


def checkpoints(url: str, client: httpx.Client, bench: uuid.UUID, args: argparse.Namespace, record: Record) -> None:
    """One pass of the checkpoint collector (api/dispatcher/checkpoint_collector.py: what it finds due and marks,
    200 at most; the files are already gone) over `--checkpoints` checkpoints of 10 each on `--jobs` jobs,
    a tenth of them with a policy (latest 3, best by a metric), half the projects with a 7-day retention,
    against a plain scan of the live checkpoints (direct SQL)."""
    from api.dispatcher.checkpoint_collector import collect

    grow_jobs(url, bench, args.jobs)
    holders = args.checkpoints // 10
    print(f"checkpoints: {args.checkpoints:,} on {holders:,} jobs", flush=True)
    sql(url, "TRUNCATE checkpoints")
    sql(url, CHECKPOINTS, (holders, 10))
    sql(
        url,
        'UPDATE jobs SET spec = spec || \'{"checkpoint": {"num_to_keep": 3, "keep_best": {"metric": "acc"}}}\''
        " WHERE id IN (SELECT id FROM jobs ORDER BY created_at LIMIT %s) AND random() < 0.1",
        (holders,),
    )
    sql(url, "UPDATE projects SET checkpoint_retention_days = 7 WHERE name LIKE 'p%' AND substr(name, 2)::int % 2 = 0")
    settle(url, "checkpoints", "jobs", "projects")

    async def passes(count: int) -> list[float]:
        engine = create_engine(Settings(database_url=url))
        took = []
        with tempfile.TemporaryDirectory() as storage:
            for _ in range(count):
                began = time.perf_counter()
                await collect(session_factory(engine), storage)
                took.append(time.perf_counter() - began)
        await engine.dispose()
        return took

    count = max(5, args.requests // 10)
    collector = ms(asyncio.run(passes(count + 1))[1:], 50, 99)
    scan = ms(
        timed(lambda: sql(url, "SELECT count(*) FROM checkpoints WHERE deleted_at IS NULL"), count, warmup=1), 50, 99
    )
    record.tables["checkpoint collector"] = [
        {"read": "one collector pass (200 marked)", "checkpoints": args.checkpoints, **collector},
        {"read": "count of the live checkpoints, direct SQL", "checkpoints": args.checkpoints, **scan},
    ]
    figure = f"checkpoint collector pass over {args.checkpoints:,} checkpoints p50, ms"
    record.ratio(figure, collector["p50_ms"], "a count of the live checkpoints", scan["p50_ms"])


def ingest(client: httpx.Client, job_id: str, points: int) -> dict[str, float]:
    """Points per second through POST /v1/jobs/{id}/metrics, as bench/ingest.py sends them (4 senders,
    batches of 1,000), and the batches' latency (a batch that waited on a lock stands out at p99 and max)."""
    shape = argparse.Namespace(batch=1000, points=points, warmup_batches=0, senders=4, procs=2)
    token = client.headers["Authorization"].removeprefix("Bearer ")
    seconds, latencies = api_batches(str(client.base_url), token, [job_id], metric_bodies(shape), shape)()
    return {"points_per_s": len(latencies) * 1000 / seconds, **ms(latencies, 50, 99), "max_ms": max(latencies) * 1000}


def metrics(url: str, client: httpx.Client, bench: uuid.UUID, args: argparse.Namespace, record: Record) -> None:
    print("metrics: ingest into an empty table", flush=True)
    empty = ingest(client, new_job(url, bench), args.ingest_points)
    big = new_job(url, bench, args.stored)
    settle(url, "metric_points")
    print(f"metrics: ingest with {args.stored:,} points stored", flush=True)
    stored = ingest(client, new_job(url, bench), args.ingest_points)
    record.tables["ingest (4 senders, batches of 1,000 points)"] = [
        {"points stored before": 0, **empty},
        {"points stored before": args.stored, **stored},
    ]
    rate = "points_per_s"
    record.ratio(f"ingest points/s with {args.stored:,} stored", stored[rate], "into an empty table", empty[rate])

    small = new_job(url, bench, 10_000)
    print(f"metrics: growing one job to {args.points:,} points", flush=True)
    bulk(url, POINTS, args.points, big, NAMES, first=args.stored + 1)
    settle(url, "metric_points", "metric_blocks")
    read = {
        size: reads(client, f"/v1/jobs/{job}/metrics", {"max_points": 1000}, args.requests)
        for size, job in ((10_000, small), (args.points, big))
    }
    returned = len(client.get(f"/v1/jobs/{big}/metrics", params={"max_points": 1000}).json()["items"])
    record.tables["downsampled metric reads (max_points=1000, 20 names)"] = [
        {"points": size, "points_returned": returned if size == args.points else None, **figures}
        for size, figures in read.items()
    ]
    for pct in ("p50_ms", "p99_ms"):
        figure = f"GET metrics?max_points=1000 {pct[:3]} at {args.points:,} points, ms"
        record.ratio(figure, read[args.points][pct], "at 10,000 points", read[10_000][pct])

    finished = new_job(url, bench, args.stored)
    old = "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '30 days' WHERE id = %s"
    sql(url, old, (finished,))
    settle(url, "metric_points")
    alone = ingest(client, new_job(url, bench), args.ingest_points)
    print(f"metrics: ingest while retention purges {args.stored:,} points", flush=True)
    purge: dict[str, Any] = {}

    async def purge_alone() -> None:  # retention's own purge round (batches of 5,000 rows)
        engine = create_engine(Settings(database_url=url, db_connect_timeout_s=60))
        try:
            began = time.perf_counter()
            purged = await purge_round(session_factory(engine), days=1, batch=5000)
            purge.update(rows=purged.rows, transactions=purged.transactions, seconds=time.perf_counter() - began)
        finally:
            await engine.dispose()

    thread = threading.Thread(target=asyncio.run, args=(purge_alone(),), name="retention")
    thread.start()
    during = ingest(client, new_job(url, bench), args.ingest_points)
    purging_at_end = thread.is_alive()
    thread.join()
    record.tables[f"ingest while retention purges {args.stored:,} points of a finished job"] = [
        {"ingest": "alone", **alone},
        {"ingest": "during the purge", **during, "purge still running at the end": purging_at_end},
    ]
    record.tables["the purge"] = [purge]
    record.ratio("ingest points/s while retention purges", during[rate], "ingest alone", alone[rate])
    record.ratio("ingest batch p99 while retention purges, ms", during["p99_ms"], "ingest alone", alone["p99_ms"])


def resumed(client: httpx.Client, job_id: str, after: int) -> float:
    """Seconds from opening the log stream at Last-Event-ID `after` to its first logs event."""
    began = time.perf_counter()
    with client.stream("GET", f"/v1/jobs/{job_id}/logs/stream", headers={"Last-Event-ID": str(after)}) as response:
        for line in response.iter_lines():
            if line.startswith("event: logs"):
                return time.perf_counter() - began
    raise RuntimeError("the stream ended without a logs event")


def logs(url: str, client: httpx.Client, bench: uuid.UUID, args: argparse.Namespace, record: Record) -> None:
    width = 120
    table: list[dict[str, Any]] = []
    jobs = {count: new_job(url, bench) for count in (1000, args.log_bytes // 120)}
    for count, job in jobs.items():
        print(f"logs: {count:,} lines of {width} characters", flush=True)
        bulk(url, LINES, count, job, width)
    sql(url, "ANALYZE log_lines")
    for count, job in jobs.items():
        last = sql(url, "SELECT max(seq) FROM log_lines WHERE job_id = %s", (job,))[0][0]
        resumes = [resumed(client, job, last - 100) for _ in range(min(args.requests, 30))]
        table.append(
            {
                "lines": count,
                "bytes": count * width,
                "tail_100": reads(client, f"/v1/jobs/{job}/logs", {"tail": 100}, args.requests),
                "stream_resume": ms(resumes, 50, 99),
            }
        )
    record.tables["logs (one job)"] = table
    small, large = table
    for figure in ("tail_100", "stream_resume"):
        name = f"logs {figure.replace('_', ' ')} p50 at {large['bytes'] / 1e9:.2g} GB, ms"
        record.ratio(name, large[figure]["p50_ms"], "at 1,000 lines", small[figure]["p50_ms"])


def main() -> None:
    args = parse_args(
        __doc__,
        ("--nodes", 1000, "simulated Ray nodes (8 GPUs, 96 CPUs each)"),
        ("--depths", [100, 1000, 10_000], "queue depths"),
        ("--finish-rounds", 20, "rounds after the cluster is full"),
        ("--jobs", 1_000_000, "job rows for the API reads"),
        ("--points", 10_000_000, "points of the big metrics job"),
        ("--ingest-points", 200_000, "points per ingest measurement"),
        ("--log-bytes", 1_000_000_000, "log bytes of the big logs job"),
        ("--checkpoints", 1_000_000, "checkpoint rows for the collector (10 per job)"),
        ("--stored", 1_000_000, "metric points stored before ingest, and purged during it"),
        ("--quota-jobs", 15_000, "queued jobs of the quotas section (Kueue's baseline shape)"),
        ("--requests", 100, "measured requests per read figure"),
        ("--sections", ["admission", "quotas", "jobs", "usage", "checkpoints", "metrics", "logs"], None),
        database=True,
    )
    os.environ.setdefault("TRAINMASTER_DB_CONNECT_TIMEOUT_S", "60")  # the API's, on a busy machine
    with run("scale", args) as record, scratch_database(record, args.database_url) as url:
        if "admission" in args.sections:
            admission(url, args, record)
        if "quotas" in args.sections:
            quotas(url, args, record)
        sql(url, "TRUNCATE projects CASCADE")
        sql(
            url,
            "INSERT INTO projects (id, name, cluster_id) SELECT gen_random_uuid(), 'p' || g,"
            " (SELECT id FROM clusters WHERE name = 'default') FROM generate_series(1, 49) g",
        )
        with api_process(url) as api:
            bench = sql(url, "SELECT id FROM projects WHERE name = 'bench'")[0][0]
            headers = {"Authorization": f"Bearer {api.token}"}
            with httpx.Client(base_url=api.url, headers=headers, timeout=120) as client:
                for section in (jobs, usage, checkpoints, metrics, logs):
                    if section.__name__ in args.sections:
                        section(url, client, bench, args, record)
        record.facts["database_bytes_at_end"] = sql(url, "SELECT pg_database_size(current_database())")[0][0]


if __name__ == "__main__":
    main()
