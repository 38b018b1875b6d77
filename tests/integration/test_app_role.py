"""The least-privilege role (migration 0022): what the API and the dispatcher connect as can read and
write rows, and nothing that takes the server (issue 27 item 3). Every real-process test also runs
the API and the dispatcher as such a login (tests/e2e/conftest.py, running_stack), so the rights
below are shown to be enough there; here, that they are not more."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from api.settings import libpq_url
from api.stack.postgres import create_login, drop_login, service_login

REFUSED = [
    ("run a program on the server", "COPY (SELECT 1) TO PROGRAM 'id'"),
    ("read a server file", "SELECT pg_read_file('/etc/passwd')"),
    ("read password hashes", "SELECT rolpassword FROM pg_authid"),
    ("create a table", "CREATE TABLE stolen (x int)"),
    ("drop a table", "DROP TABLE jobs"),
    ("change a table", "ALTER TABLE jobs ADD COLUMN x int"),
    ("disable a trigger", "ALTER TABLE job_attempts DISABLE TRIGGER ALL"),
    ("make a role", "CREATE ROLE intruder SUPERUSER LOGIN"),
    ("grant itself more", "ALTER ROLE CURRENT_USER SUPERUSER"),
    ("move the migration head", "UPDATE alembic_version SET version_num = 'x'"),
    ("empty a table at once", "TRUNCATE jobs"),
]


@pytest.fixture(params=["deployment", "local stack"])
def login(request: pytest.FixtureRequest, pg_server_url: str, database_url: str) -> Iterator[str]:
    """A login of the role as a deployment makes one (create_login), and as `trainmaster up` does for its
    embedded server (service_login: made the first time, its password renewed by the second)."""
    if request.param == "deployment":
        url = create_login(pg_server_url, database_url)
    else:
        service_login(database_url)
        url = service_login(database_url)
    yield url
    drop_login(pg_server_url, url)


@pytest.mark.parametrize(("what", "statement"), REFUSED, ids=[what for what, _ in REFUSED])
def test_the_app_role_is_refused(login: str, what: str, statement: str) -> None:
    with (
        psycopg.connect(libpq_url(login), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(statement)


def test_the_app_role_reads_and_writes_rows_and_listens(login: str) -> None:
    with psycopg.connect(libpq_url(login), autocommit=True) as conn:
        assert conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False, False, False)
        cluster = conn.execute("SELECT id FROM clusters WHERE name = 'default'").fetchone()
        assert cluster is not None
        conn.execute(
            "INSERT INTO projects (id, name, cluster_id) VALUES (gen_random_uuid(), 'rights', %s)", (cluster[0],)
        )
        conn.execute("UPDATE projects SET max_priority = 5 WHERE name = 'rights'")
        conn.execute("DELETE FROM projects WHERE name = 'rights'")
        conn.execute("LISTEN tm_jobs")
        conn.execute("SELECT pg_advisory_xact_lock(1)")
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
