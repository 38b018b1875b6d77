"""The admission order exists once in Python (api/queues/order.py) and once in SQL (api/queues/sql.py):
on random queues, the claim a round takes its batch with (CLAIM) comes in exactly the order the Python
key and progressive filling give, over shares computed in Python from the same histories, holdings and
capacities, and the shares agree to the bit."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from api.db.session import create_engine, session_factory
from api.queues import repository
from api.queues.order import dominant_share, progressive_batch
from api.settings import Settings
from api.settings import libpq_url as libpq

CAPACITY = {"CPU": 96.0, "GPU": 24.0}


def claim(database_url: str, limit: int) -> list[repository.QueuedJob]:
    async def go() -> list[repository.QueuedJob]:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session, session.begin():
                return await repository.lock_queued(session, limit)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def fill(database_url: str, rng: random.Random) -> tuple[dict[uuid.UUID, dict[str, Any]], list[dict[str, Any]]]:
    """Random projects (history, holdings, one capacity) and queued jobs (priorities, gangs, ages)."""
    projects: dict[uuid.UUID, dict[str, Any]] = {}
    jobs: list[dict[str, Any]] = []
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        cluster = conn.execute("SELECT id FROM clusters ORDER BY name LIMIT 1").fetchone()
        assert cluster is not None
        for n in range(rng.randint(3, 6)):
            pid = uuid.uuid4()
            history = {"CPU": rng.choice([0.0, rng.random() * 0.3]), "GPU": rng.choice([0.0, rng.random() * 0.3])}
            held = {"CPU": float(rng.randint(0, 20)), "GPU": float(rng.randint(0, 6))}
            projects[pid] = {"history": history, "held": held}
            conn.execute(
                "INSERT INTO projects (id, name, cluster_id) VALUES (%s, %s, %s)",
                (pid, f"order-{n}-{pid.hex[:6]}", cluster[0]),
            )
            conn.execute(
                "INSERT INTO project_usage (project_id, active, cpus, gpus, history_cpus, history_gpus,"
                " cpu_capacity, gpu_capacity) VALUES (%s, 0, %s, %s, %s, %s, %s, %s)",
                (pid, held["CPU"], held["GPU"], history["CPU"], history["GPU"], CAPACITY["CPU"], CAPACITY["GPU"]),
            )
        for _ in range(rng.randint(40, 120)):
            job = {
                "id": uuid.uuid4(),
                "project_id": rng.choice(list(projects)),
                "priority": rng.choice([0, 0, 0, 5, -3]),
                "gang_cpus": float(rng.choice([1, 2, 4, 8])) * rng.choice([1.0, 0.5, 0.25]),
                "gang_gpus": float(rng.choice([0, 1, 2, 4])),
                "created_at": start + timedelta(seconds=rng.randint(0, 3600)),
            }
            jobs.append(job)
            conn.execute(
                "INSERT INTO jobs (id, project_id, name, status, spec, priority, gang_cpus, gang_gpus, created_at)"
                " VALUES (%(id)s, %(project_id)s, 'order', 'queued', '{}'::jsonb, %(priority)s, %(gang_cpus)s,"
                " %(gang_gpus)s, %(created_at)s)",
                job,
            )
    return projects, jobs


@dataclass(frozen=True)
class Row:
    """A queued job as order.py reads it."""

    id: uuid.UUID
    project_id: uuid.UUID
    priority: int
    gang_cpus: float
    gang_gpus: float
    created_at: datetime
    share: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    infeasible_since: datetime | None = None
    bypassed_since: datetime | None = None


def python_order(projects: dict[uuid.UUID, dict[str, Any]], jobs: list[dict[str, Any]]) -> list[Row]:
    def own_order(pid: uuid.UUID) -> Iterator[Row]:
        mine = [Row(**job) for job in jobs if job["project_id"] == pid]
        return iter(sorted(mine, key=lambda r: (-r.priority, r.created_at, r.id)))

    def with_share(row: Row, ahead: Mapping[str, float]) -> Row:
        standing = projects[row.project_id]
        # Whole thousandths, as the SQL sums them (exact in any order).
        held = {r: (round(standing["held"][r] * 1000) + sum_millis(ahead[r])) / 1000 for r in ahead}
        return replace(row, share=dominant_share(standing["history"], held, CAPACITY))

    def sum_millis(amount: float) -> int:
        return round(amount * 1000)

    return progressive_batch((own_order(pid) for pid in projects), with_share, len(jobs))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_claim_takes_the_queue_in_the_order_the_python_key_gives(fresh_database_url: str, seed: int) -> None:
    rng = random.Random(seed)
    projects, jobs = fill(fresh_database_url, rng)
    claimed = claim(fresh_database_url, len(jobs))
    expected = python_order(projects, jobs)
    assert [job.id for job in claimed] == [row.id for row in expected]
    assert len({round(job.share, 9) for job in claimed}) > 3  # the shares differ: the key's 2nd part counts
    for job, row in zip(claimed, expected, strict=True):
        assert job.share == pytest.approx(row.share, abs=1e-12)
