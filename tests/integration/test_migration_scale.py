"""Revision 0005_scale on a database that already holds jobs and points: the counters and the metric
blocks it fills equal a recount, the triggers carry on from there, and it downgrades cleanly."""

from __future__ import annotations

from typing import Any

import psycopg

from api.db import migrate
from api.settings import libpq_url as libpq
from api.stack.postgres import create_database, drop_database

BLOCKS_RECOUNT = """
    SELECT name, rank, seq >> 12, count(*)::int, min(value), max(value),
           (array_agg(seq ORDER BY value, seq))[1], (array_agg(seq ORDER BY value DESC, seq))[1]
    FROM metric_points GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""
BLOCKS = "SELECT name, rank, block, n, lo_value, hi_value, lo_seq, hi_seq FROM metric_blocks ORDER BY 1, 2, 3"


def rows(url: str, statement: str, params: Any = None) -> list[Any]:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def test_counters_and_blocks_of_existing_rows_then_triggers_then_downgrade(pg_server_url: str) -> None:
    url = create_database(pg_server_url, "tm_migr_scale")
    try:
        migrate.upgrade(url, "0004_preemption")
        project = rows(url, "INSERT INTO projects (id, name) VALUES (gen_random_uuid(), 'p') RETURNING id")[0][0]
        for status, priority, gpus in (("queued", 0, 1), ("queued", 0, 2), ("queued", 5, 1), ("running", 0, 0.5)):
            rows(
                url,
                "INSERT INTO jobs (id, project_id, name, status, spec, priority, gang_gpus, gang_cpus)"
                " VALUES (gen_random_uuid(), %s, 'j', %s, '{}', %s, %s, 3)",
                (project, status, priority, gpus),
            )
        job = rows(url, "SELECT id FROM jobs WHERE status = 'running'")[0][0]
        points = "INSERT INTO metric_points (job_id, rank, step, name, value) SELECT %s, g %% 2, g, n, random()"
        rows(url, points + " FROM generate_series(1, 9000) g CROSS JOIN unnest(ARRAY['a', 'b']) n", (job,))

        migrate.upgrade(url, "head")
        assert rows(url, "SELECT priority, sum(queued)::int FROM queue_counts GROUP BY 1 ORDER BY 1") == [
            (0, 2),
            (5, 1),
        ]
        assert rows(url, "SELECT active, gpus::float, cpus::float FROM project_usage") == [(1, 0.5, 3.0)]
        assert rows(url, BLOCKS) == rows(url, BLOCKS_RECOUNT)

        rows(url, points + " FROM generate_series(9001, 12000) g CROSS JOIN unnest(ARRAY['a', 'c']) n", (job,))
        rows(url, "UPDATE jobs SET status = 'starting' WHERE priority = 5")
        assert rows(url, BLOCKS) == rows(url, BLOCKS_RECOUNT)
        assert rows(url, "SELECT active, gpus::float FROM project_usage") == [(2, 1.5)]
        migrate.check(url)

        migrate.downgrade(url, "0004_preemption")
        tables = {r[0] for r in rows(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert not {"metric_blocks", "queue_counts", "project_usage"} & tables
        assert rows(url, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'tm_%'") == [(0,)]
        assert rows(url, "SELECT count(*) FROM metric_points") == [(24_000,)]
    finally:
        drop_database(pg_server_url, url)
