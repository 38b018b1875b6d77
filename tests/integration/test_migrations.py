from __future__ import annotations

import psycopg
import pytest

from api.db import migrate
from api.settings import libpq_url as libpq
from api.stack.postgres import create_database, drop_database


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


def test_attempt_status_becomes_an_enum_keeping_every_row(pg_server_url: str) -> None:
    url = create_database(pg_server_url, "tm_migr_attempts")
    try:
        migrate.upgrade(url, "0001")
        with psycopg.connect(libpq(url)) as conn:
            project = conn.execute("INSERT INTO projects (id, name) VALUES (gen_random_uuid(), 'p') RETURNING id")
            project_id = project.fetchone()[0]  # type: ignore[index]
            job = conn.execute(
                "INSERT INTO jobs (id, project_id, name, status, spec) "
                "VALUES (gen_random_uuid(), %s, 'j', 'running', '{}') RETURNING id",
                (project_id,),
            )
            job_id = job.fetchone()[0]  # type: ignore[index]
            for n, status in enumerate(("lost", "timing_out", "running"), start=1):
                conn.execute(
                    "INSERT INTO job_attempts (job_id, n, ray_submission_id, status) VALUES (%s, %s, %s, %s)",
                    (job_id, n, f"tm-{job_id}-{n}", status),
                )
        migrate.upgrade(url, "head")
        with psycopg.connect(libpq(url)) as conn:
            column_type = conn.execute(
                "SELECT udt_name FROM information_schema.columns"
                " WHERE table_name = 'job_attempts' AND column_name = 'status'"
            ).fetchone()
            assert column_type == ("attempt_status",)
            rows = conn.execute("SELECT status::text FROM job_attempts ORDER BY n").fetchall()
            assert [row[0] for row in rows] == ["lost", "timing_out", "running"]
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                conn.execute("UPDATE job_attempts SET status = 'exploded'")
        migrate.downgrade(url, "0001")
        with psycopg.connect(libpq(url)) as conn:
            rows = conn.execute("SELECT status FROM job_attempts ORDER BY n").fetchall()
            assert [row[0] for row in rows] == ["lost", "timing_out", "running"]
            assert conn.execute("SELECT 1 FROM pg_type WHERE typname = 'attempt_status'").fetchone() is None
    finally:
        drop_database(pg_server_url, url)
