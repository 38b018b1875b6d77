"""Revision 0013_trust_domains on a database that already holds projects, tokens and jobs: every project
lands on cluster `default` with today's priority range, live job tokens become scope `job`, api_tokens
and jobs are not rewritten (same relfilenode), and it downgrades cleanly."""

from __future__ import annotations

from typing import Any

import psycopg

from api.db import migrate
from api.settings import libpq_url as libpq
from api.stack.postgres import create_database, drop_database


def rows(url: str, statement: str, params: Any = None) -> list[Any]:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


FILES = "SELECT relname, relfilenode FROM pg_class WHERE relname IN ('api_tokens', 'jobs') ORDER BY 1"


def test_existing_projects_and_tokens_keep_working_without_a_rewrite(pg_server_url: str) -> None:
    url = create_database(pg_server_url, "tm_migr_trust")
    try:
        migrate.upgrade(url, "0012_job_event_repeats")
        ((project_id,),) = rows(url, "INSERT INTO projects (id, name) VALUES (gen_random_uuid(), 'old') RETURNING id")
        ((job_id,),) = rows(
            url,
            "INSERT INTO jobs (id, project_id, name, status, spec) VALUES (gen_random_uuid(), %s, 'j', 'running', '{}')"
            " RETURNING id",
            (project_id,),
        )
        for token_hash, job in (("a" * 64, None), ("b" * 64, job_id)):
            rows(
                url,
                "INSERT INTO api_tokens (id, project_id, job_id, token_hash) VALUES (gen_random_uuid(), %s, %s, %s)",
                (project_id, job, token_hash),
            )
        before = rows(url, FILES)

        migrate.upgrade(url, "head")
        assert rows(url, FILES) == before  # no table rewrite
        assert rows(
            url, "SELECT p.name, c.name, p.max_priority FROM projects p JOIN clusters c ON c.id = p.cluster_id"
        ) == [("old", "default", 100)]
        assert rows(url, "SELECT token_hash, scope, expires_at FROM api_tokens ORDER BY 1") == [
            ("a" * 64, "project", None),
            ("b" * 64, "job", None),
        ]
        migrate.check(url)

        migrate.downgrade(url, "0012_job_event_repeats")
        assert rows(url, "SELECT to_regclass('clusters')") == [(None,)]
        assert rows(url, "SELECT count(*) FROM api_tokens") == [(2,)]
    finally:
        drop_database(pg_server_url, url)
