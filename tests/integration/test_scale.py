"""Correctness behind the scale work (speed is measured in bench/scale.py, never here): queue
positions are the admission order under fair share, the maintained counters equal a recount, the
downsampled read from metric_blocks keeps every bucket's extremes, logs tail, and retention deletes
exactly the data of jobs finished long enough ago."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession

from api.db.session import create_engine, session_factory
from api.metrics import repository as metrics_repository
from api.queues import repository as queues_repository
from api.queues.order import admission_key
from api.retention.repository import RETENTION_LOCK
from api.retention.service import Purged, purge_round
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import project_token
from tests.factories.database import in_session, sql
from tests.factories.http import bearer, submit
from tests.factories.jobs import spec

T = TypeVar("T")


def gpus(n: int) -> dict[str, Any]:
    return {"scaling": {"num_workers": n, "resources_per_worker": {"CPU": 1, "GPU": 1}}}


def assert_counters_match_a_recount(database_url: str) -> None:
    counted = sql(
        database_url,
        "SELECT priority, project_id::text, sum(queued)::int, sum(cpu_millis)::bigint, sum(gpu_millis)::bigint"
        " FROM queue_counts GROUP BY 1, 2 HAVING sum(queued) <> 0",
    )
    recount = sql(
        database_url,
        "SELECT priority, project_id::text, count(*)::int, sum(round(gang_cpus * 1000))::bigint,"
        " sum(round(gang_gpus * 1000))::bigint FROM jobs WHERE status = 'queued' GROUP BY 1, 2",
    )
    assert sorted(counted) == sorted(recount)
    usage = sql(database_url, "SELECT project_id::text, gpus::float, cpus::float FROM project_usage WHERE active > 0")
    active = sql(
        database_url,
        "SELECT project_id::text, sum(gang_gpus), sum(gang_cpus) FROM jobs"
        " WHERE status IN ('starting', 'running', 'cancelling') GROUP BY 1",
    )
    assert sorted((p, round(g, 9), round(c, 9)) for p, g, c in usage) == sorted(
        (p, round(g, 9), round(c, 9)) for p, g, c in active
    )


def test_queue_position_equals_admission_order_under_fair_share(http: TestClient, database_url: str) -> None:
    """Many projects, priorities, running gangs and projects tied on usage: every queued job's
    position is its place in the order the dispatcher's own claim query returns."""
    rng = random.Random(7)
    tokens = {name: project_token(database_url, name) for name in ("alpha", "beta", "gamma", "delta")}
    running = [submit(http, tokens["alpha"], **gpus(2)), submit(http, tokens["beta"], **gpus(1))]
    running.append(submit(http, tokens["gamma"], **gpus(1)))  # beta and gamma tie on usage
    sql(database_url, "UPDATE jobs SET status = 'running' WHERE id = ANY(%s::uuid[])", (running,))
    queued = [
        submit(http, tokens[rng.choice(list(tokens))], priority=rng.choice([0, 0, 0, 5, -3]), **gpus(rng.randint(1, 4)))
        for _ in range(30)
    ]
    cancelled = queued.pop(3)
    http.post(f"/v1/jobs/{cancelled}/cancel", headers=bearer(tokens["alpha"]))
    sql(database_url, "UPDATE jobs SET status = 'cancelled' WHERE id = %s", (cancelled,))
    started = queued.pop(5)
    sql(database_url, "UPDATE jobs SET status = 'starting' WHERE id = %s", (started,))  # usage changes too

    async def claim_order(session: AsyncSession) -> list[str]:
        return [str(job.id) for job in await queues_repository.lock_queued(session, 1000)]

    order = in_session(database_url, claim_order)
    assert sorted(order) == sorted(queued)

    async def python_order(session: AsyncSession) -> list[str]:  # decide's key over the rows the SQL read
        claimed = await queues_repository.lock_queued(session, 1000)
        assert len({job.share for job in claimed}) > 2  # the projects' shares differ: the key's 2nd part counts
        return [str(job.id) for job in sorted(reversed(claimed), key=admission_key)]

    assert in_session(database_url, python_order) == order  # the SQL's ORDER BY is decide.admission_key
    project_of = dict(sql(database_url, "SELECT j.id::text, p.name FROM jobs j JOIN projects p ON p.id = j.project_id"))
    positions = {}
    for job_id in queued:
        headers = bearer(tokens[project_of[job_id]])
        positions[job_id] = http.get(f"/v1/jobs/{job_id}", headers=headers).json()["queue_position"]
    assert [job_id for job_id, _ in sorted(positions.items(), key=lambda item: item[1])] == order
    assert sorted(positions.values()) == list(range(1, len(order) + 1))

    listed = http.get("/v1/jobs", params={"limit": 500}, headers=bearer(tokens["beta"])).json()
    for item in listed["items"]:
        assert item["queue_position"] == (positions.get(item["id"]))
    assert_counters_match_a_recount(database_url)


def test_positions_follow_progressive_filling_with_fractional_gangs_and_sampled_shares(
    http: TestClient, database_url: str
) -> None:
    """Each job's share adds the gangs of its project ahead of it (fractions of a CPU too), against the
    cluster's sampled capacity: three projects whose shares straddle each other's interleave, and every
    position (one job's read, a page, a new job's answer) is its place in the claim order."""
    rng = random.Random(3)
    tokens = {name: project_token(database_url, name) for name in ("north", "south", "east")}
    for _ in range(45):
        name = rng.choice(list(tokens))
        cpus = rng.choice([0.1, 0.5, 1.5, 2])
        submit(
            http,
            tokens[name],
            priority=rng.choice([0, 0, 2]),
            scaling={"num_workers": 1, "resources_per_worker": {"CPU": cpus}},
        )
    # north has some history, south holds a little; east has no row: its share is of the cluster's capacity
    sql(
        database_url,
        "INSERT INTO project_usage (project_id, active, gpus, cpus, history_cpus, history_weight, cpu_capacity,"
        " gpu_capacity, sampled_at) SELECT id, 0, 0, CASE name WHEN 'south' THEN 0.5 ELSE 0 END,"
        " CASE name WHEN 'north' THEN 0.03 ELSE 0 END, 1, 40, 0, now() FROM projects WHERE name IN ('north', 'south')",
    )

    async def claim_order(session: AsyncSession) -> list[Any]:
        return list(await queues_repository.lock_queued(session, 1000))

    claimed = in_session(database_url, claim_order)
    order = [str(job.id) for job in claimed]
    shares = {}
    for job in claimed:
        shares.setdefault(job.project_id, []).append(job.share)
    assert all(mine == sorted(mine) for mine in shares.values())  # a project's shares grow along its queue
    projects_in_order = [job.project_id for job in claimed if job.priority == 0]
    switches = sum(a != b for a, b in itertools.pairwise(projects_in_order))
    assert switches > 3  # the projects interleave: no project's whole queue goes first
    project_of = dict(sql(database_url, "SELECT j.id::text, p.name FROM jobs j JOIN projects p ON p.id = j.project_id"))
    for n, job_id in enumerate(order, start=1):
        headers = bearer(tokens[project_of[job_id]])
        assert http.get(f"/v1/jobs/{job_id}", headers=headers).json()["queue_position"] == n
    for name, token in tokens.items():
        listed = http.get("/v1/jobs", params={"limit": 500}, headers=bearer(token)).json()
        assert {item["id"]: item["queue_position"] for item in listed["items"]} == {
            job_id: n for n, job_id in enumerate(order, start=1) if project_of[job_id] == name
        }
    headers = bearer(tokens["east"])
    body = spec(priority=2, scaling={"num_workers": 1, "resources_per_worker": {"CPU": 0.1}})
    answer = http.post("/v1/jobs", json=body, headers=headers).json()  # ahead of every priority-0 job
    new_order = [str(job.id) for job in in_session(database_url, claim_order)]
    assert answer["queue_position"] == new_order.index(answer["id"]) + 1 < len(new_order)
    assert http.get(f"/v1/jobs/{answer['id']}", headers=headers).json()["queue_position"] == answer["queue_position"]
    assert_counters_match_a_recount(database_url)


def test_a_submission_answers_the_position_a_read_gives(http: TestClient, database_url: str) -> None:
    """POST /v1/jobs computes the new job's place from the maintained counts, GET /v1/jobs/{id} counts
    the tied jobs ahead: with priorities above and below, a project holding GPUs and projects tied on
    usage, both say the same for every new job, and that is its place in the claim order."""
    rng = random.Random(11)
    tokens = {name: project_token(database_url, name) for name in ("red", "green", "blue")}
    holder = submit(http, tokens["red"], **gpus(2))
    sql(database_url, "UPDATE jobs SET status = 'running' WHERE id = %s", (holder,))  # red holds 2 GPUs
    for _ in range(24):
        name = rng.choice(list(tokens))
        headers = bearer(tokens[name])
        body = spec(priority=rng.choice([0, 0, 3, -1]), **gpus(rng.randint(1, 2)))
        answer = http.post("/v1/jobs", json=body, headers=headers)
        assert answer.status_code == 201, answer.text
        job = answer.json()
        assert job["queue_position"] is not None
        assert http.get(f"/v1/jobs/{job['id']}", headers=headers).json()["queue_position"] == job["queue_position"]

        async def claim_order(session: AsyncSession) -> list[str]:
            return [str(row.id) for row in await queues_repository.lock_queued(session, 1000)]

        assert in_session(database_url, claim_order).index(job["id"]) + 1 == job["queue_position"]


def test_positions_of_a_page_deep_in_a_tied_queue(http: TestClient, database_url: str) -> None:
    """Projects holding nothing tie: a page in the middle of one project's queue counts the tied jobs
    older than the page and numbers the ones among it, and still equals the claim order."""
    tokens = [project_token(database_url, f"tie{i}") for i in range(3)]
    for i in range(45):
        submit(http, tokens[(i * 5) % 3], priority=(i * 7) % 2)

    async def claim_order(session: AsyncSession) -> list[str]:
        return [str(job.id) for job in await queues_repository.lock_queued(session, 1000)]

    place = {job_id: n for n, job_id in enumerate(in_session(database_url, claim_order), start=1)}
    headers = bearer(tokens[1])
    seen, cursor = 0, None
    while True:
        params: dict[str, Any] = {"limit": 4, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/jobs", params=params, headers=headers).json()
        for item in page["items"]:
            assert item["queue_position"] == place[item["id"]]
            seen += 1
        if not (cursor := page["next_cursor"]):
            break
    assert seen == 15


def test_positions_counted_from_either_end_of_a_tied_queue_agree(http: TestClient, database_url: str) -> None:
    """The jobs older than a page are counted either directly or as the project's maintained count
    less the jobs at or after the page (QUEUE_POSITIONS picks by NEWER_CAP): both equal the claim order,
    with tied projects, two priorities, a project holding GPUs and a cancelled job in between."""
    tokens = [project_token(database_url, f"end{i}") for i in range(3)]
    holder = submit(http, tokens[2], **gpus(1))
    sql(database_url, "UPDATE jobs SET status = 'running' WHERE id = %s", (holder,))
    queued = [submit(http, tokens[i % 3], priority=(i * 5) % 2) for i in range(36)]
    http.post(f"/v1/jobs/{queued[7]}/cancel", headers=bearer(tokens[7 % 3]))

    async def claim_order(session: AsyncSession) -> list[str]:
        return [str(job.id) for job in await queues_repository.lock_queued(session, 1000)]

    place = {job_id: n for n, job_id in enumerate(in_session(database_url, claim_order), start=1)}
    assert len(place) == 35
    ids = [uuid.UUID(job_id) for job_id in place]
    for cap in (0, 1, 3, 1000):  # 0: always count the older jobs; 1000: always take the maintained count

        async def positions(session: AsyncSession, cap: int = cap) -> dict[str, int]:
            pages = [ids[n : n + 4] for n in range(0, len(ids), 4)]
            found: dict[str, int] = {}
            for page in pages:
                got = await queues_repository.queue_positions_of(session, page, newer_cap=cap)
                found.update({str(job_id): position for job_id, position in got.items()})
            return found

        assert in_session(database_url, positions) == place, f"newer_cap={cap}"


def test_claim_reads_a_few_per_project_yet_keeps_the_global_order(database_url: str, http: TestClient) -> None:
    """With a limit smaller than the queue, the claim returns the first `limit` of the whole order."""
    tokens = [project_token(database_url, f"p{i}") for i in range(5)]
    for i in range(25):
        submit(http, tokens[i % 5], priority=(i * 7) % 3)

    async def claim(limit: int) -> Callable[[AsyncSession], Awaitable[list[str]]]:
        async def go(session: AsyncSession) -> list[str]:
            return [str(job.id) for job in await queues_repository.lock_queued(session, limit)]

        return go

    everything = in_session(database_url, asyncio.run(claim(1000)))
    first = in_session(database_url, asyncio.run(claim(4)))
    assert first == everything[:4]


def test_counters_follow_inserts_updates_and_deletes(http: TestClient, database_url: str, token: str) -> None:
    ids = [submit(http, token, priority=p, **gpus(2)) for p in (0, 0, 3)]
    sql(database_url, "UPDATE jobs SET status = 'starting' WHERE id = %s", (ids[0],))
    sql(database_url, "UPDATE jobs SET status = 'running' WHERE id = %s", (ids[0],))
    sql(database_url, "UPDATE jobs SET priority = 9 WHERE id = %s", (ids[1],))
    assert_counters_match_a_recount(database_url)
    sql(database_url, "UPDATE jobs SET gang_gpus = 0.1, gang_cpus = 0.2 WHERE id = %s", (ids[0],))
    assert_counters_match_a_recount(database_url)
    sql(database_url, "UPDATE jobs SET status = 'succeeded' WHERE id = %s", (ids[0],))
    sql(database_url, "DELETE FROM jobs WHERE id = %s", (ids[2],))
    assert_counters_match_a_recount(database_url)
    assert sql(database_url, "SELECT active, gpus::float, cpus::float FROM project_usage") == [(0, 0.0, 0.0)]


def insert_points(database_url: str, job_id: str, count: int, names: tuple[str, ...], spike_at: int) -> None:
    """`count` points per name, steps 1..count, values in [0, 1) but 100 (and -100) at `spike_at`."""
    sql(
        database_url,
        "INSERT INTO metric_points (job_id, rank, step, name, value)"
        " SELECT %s, g %% 2, g, n, CASE WHEN g = %s THEN 100 WHEN g = %s + 1 THEN -100 ELSE random() END"
        " FROM generate_series(1, %s) g CROSS JOIN unnest(%s::text[]) n ORDER BY g",
        (job_id, spike_at, spike_at, count, list(names)),
    )


def test_blocks_receive_points_and_serve_downsampled_reads(
    http: TestClient, auth: dict[str, str], token: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(http, token)
    ingest = {
        "points": [{"step": s, "values": {"loss": s / 10, "acc": 1 - s / 1000}, "rank": 0} for s in range(1, 301)]
    }
    assert http.post(f"/v1/jobs/{job_id}/metrics", json=ingest, headers=auth).status_code == 201
    insert_points(database_url, job_id, 20_000, ("loss", "acc"), spike_at=12_345)
    assert sql(database_url, "SELECT sum(n)::int FROM metric_blocks WHERE job_id = %s", (job_id,)) == [(40_600,)]
    assert sql(
        database_url,
        "SELECT count(*) FROM metric_blocks b WHERE job_id = %s AND lo_seq IS DISTINCT FROM"
        " (SELECT seq FROM metric_points p WHERE p.job_id = b.job_id AND p.name = b.name AND p.rank = b.rank"
        "  AND p.seq >> 12 = b.block ORDER BY value, seq LIMIT 1)",
        (job_id,),
    ) == [(0,)]

    monkeypatch.setattr(metrics_repository, "RAW_DOWNSAMPLE_LIMIT", 1000)  # the blocks path, with few points
    url = f"/v1/jobs/{job_id}/metrics"
    items = http.get(url, params={"max_points": 100}, headers=auth).json()["items"]
    for name in ("loss", "acc"):
        values = [item["value"] for item in items if item["name"] == name]
        assert 2 < len(values) <= 100
        assert max(values) == 100 and min(values) == -100  # the one-step spike survives
    assert [item["seq"] for item in items] == sorted(item["seq"] for item in items)

    zoomed = http.get(
        url, params={"max_points": 40, "since_step": 12_000, "until_step": 12_400, "name": "acc"}, headers=auth
    )
    zoomed_items = zoomed.json()["items"]
    assert zoomed_items and all(12_000 <= item["step"] <= 12_400 and item["name"] == "acc" for item in zoomed_items)
    assert {100.0, -100.0} <= {item["value"] for item in zoomed_items}
    assert len(zoomed_items) <= 40

    odd = http.get(url, params={"max_points": 50, "rank": 1, "name": "loss"}, headers=auth).json()["items"]
    assert odd and {item["rank"] for item in odd} == {1}
    assert 100.0 in {item["value"] for item in odd} and -100.0 not in {
        item["value"] for item in odd
    }  # step 12,346 is rank 0


def test_logs_tail_is_the_last_lines_oldest_first(
    http: TestClient, auth: dict[str, str], token: str, database_url: str
) -> None:
    job_id = submit(http, token)
    sql(
        database_url,
        "INSERT INTO log_lines (job_id, attempt, source, line) SELECT %s, 1, 'driver', 'line ' || g"
        " FROM generate_series(1, 500) g ORDER BY g",
        (job_id,),
    )
    tail = http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 3}, headers=auth).json()["items"]
    assert [item["line"] for item in tail] == ["line 498", "line 499", "line 500"]
    after = http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 1000, "after_seq": tail[0]["seq"]}, headers=auth)
    assert [item["line"] for item in after.json()["items"]] == ["line 499", "line 500"]


def test_retention_deletes_exactly_the_data_of_jobs_finished_long_ago(
    http: TestClient, token: str, database_url: str
) -> None:
    old, recent, running, old_unfinished = (submit(http, token) for _ in range(4))
    sql(
        database_url,
        "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '10 days' WHERE id = %s",
        (old,),
    )
    sql(
        database_url,
        "UPDATE jobs SET status = 'failed', finished_at = now() - interval '1 day' WHERE id = %s",
        (recent,),
    )
    sql(  # finished_at set too (left from an earlier attempt): only the status says it is not done
        database_url,
        "UPDATE jobs SET status = 'running', created_at = now() - interval '30 days',"
        " finished_at = now() - interval '30 days' WHERE id = %s",
        (running,),
    )
    sql(database_url, "UPDATE jobs SET created_at = now() - interval '30 days' WHERE id = %s", (old_unfinished,))
    for job_id in (old, recent, running, old_unfinished):
        insert_points(database_url, job_id, 40, ("loss",), spike_at=3)
        sql(
            database_url,
            "INSERT INTO log_lines (job_id, source, line) SELECT %s, 'driver', 'x' FROM generate_series(1, 25)",
            (job_id,),
        )
        sql(
            database_url,
            "INSERT INTO metric_batches (job_id, batch_id, points) VALUES (%s, %s, 1)",
            (job_id, uuid.uuid4()),
        )
    events_before = sql(database_url, "SELECT count(*) FROM job_events")

    def stored(table: str) -> dict[str, int]:
        return dict(sql(database_url, f"SELECT job_id::text, count(*)::int FROM {table} GROUP BY 1"))

    async def purge(days: float) -> Any:
        engine = create_engine(Settings(database_url=database_url))
        try:
            return await purge_round(session_factory(engine), days=days, batch=7)
        finally:
            await engine.dispose()

    with psycopg.connect(libpq(database_url), autocommit=True) as other_replica:
        other_replica.execute("SELECT pg_advisory_lock(%s)", (RETENTION_LOCK,))
        assert asyncio.run(purge(7)) == Purged()  # another replica is purging: this one does nothing
    assert stored("metric_points")[old] == 40

    purged = asyncio.run(purge(7))
    assert purged.jobs == 1
    assert purged.transactions > 40 // 7  # in batches, not one statement
    for table in ("metric_points", "log_lines", "metric_blocks", "metric_batches"):
        assert old not in stored(table), table
        assert {recent, running, old_unfinished} <= set(stored(table)), table
    assert stored("metric_points")[recent] == 40 and stored("log_lines")[running] == 25
    assert sql(database_url, "SELECT id::text FROM jobs WHERE purged_at IS NOT NULL") == [(old,)]
    assert sql(database_url, "SELECT count(*) FROM jobs") == [(4,)]
    assert sql(database_url, "SELECT count(*) FROM job_events") == events_before
    assert asyncio.run(purge(7)).jobs == 0  # done once
    assert asyncio.run(purge(0.5)).jobs == 1  # the recent one, with a shorter retention
