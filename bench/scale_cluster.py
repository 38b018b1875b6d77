"""The admission half of bench/scale.py: a simulated Ray cluster of many nodes and the dispatcher's
own admission round (`api.dispatcher.admission.admit_round`) run against it, on a real database.

`SimRay` is the in-memory Ray model of tests/factories/ray.py grown to many nodes: `cluster()` answers
every node's total and free resources, `submit()` places the gang the way a placement group would
(the dispatcher's own first-fit, `api.dispatcher.placement.admit`) and takes it out of the free
resources; `finish()` gives a finished job's resources back. Nothing here talks to a real Ray.
"""

from __future__ import annotations

import hashlib
import io
import math
import random
import time
import uuid
import zipfile
from typing import Any

import psycopg
from harness import ms
from psycopg.types.json import Jsonb
from sqlalchemy import text

from api.db.session import create_engine, session_factory
from api.dispatcher.backend import GangState, Launch, RayJobInfo, RayJobState
from api.dispatcher.placement import Cluster, Decision, Node, Resources, admit
from api.dispatcher.service import Dispatcher, freeze_heap
from api.settings import Settings
from trainmaster.models import JobSpec

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
    def __init__(self, nodes: int) -> None:
        self.free = [Node(f"node{i:05d}", dict(NODE), dict(NODE), f"10.0.{i // 250}.{i % 250}") for i in range(nodes)]
        self.specs: dict[str, JobSpec] = {}  # job id -> spec, for placing its gang
        self.placed: dict[str, dict[str, list[Resources]]] = {}  # job id -> node -> bundles
        self.view: Cluster | None = None  # the nodes as placement sees them between finishes (see submit)

    def cluster(self) -> Cluster:
        return Cluster([Node(n.node_id, dict(n.total), dict(n.free), n.ip) for n in self.free])

    def submit(self, launch: Launch) -> bool:
        """Place the gang as Ray would. One `Cluster` view of the nodes is kept between submits (what
        placement remembers stays true while resources are only taken), so the simulator's own cost
        per submit stays small beside the dispatcher's; `finish` drops it."""
        job_id = launch.metadata["trainmaster_job_id"]
        self.view = self.view or Cluster(self.free)
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
        freeze_heap()

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
