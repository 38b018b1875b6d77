from __future__ import annotations

import psycopg

from api.db import migrate
from tests.conftest import libpq


def tables(url: str) -> set[str]:
    with psycopg.connect(libpq(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {row[0] for row in rows}


def test_empty_database_migrates_to_head_matches_models_and_downgrades(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert {
        "projects",
        "api_tokens",
        "jobs",
        "job_attempts",
        "job_events",
        "metric_points",
        "log_lines",
        "code_packages",
        "checkpoints",
    } <= tables(empty_database_url)

    migrate.check(empty_database_url)  # raises if autogenerate finds a difference

    migrate.downgrade(empty_database_url, "base")
    assert tables(empty_database_url) <= {"alembic_version"}
    with psycopg.connect(libpq(empty_database_url)) as conn:
        assert conn.execute("SELECT 1 FROM pg_type WHERE typname = 'job_status'").fetchone() is None

    migrate.upgrade(empty_database_url)  # and back up again from base
    migrate.check(empty_database_url)
