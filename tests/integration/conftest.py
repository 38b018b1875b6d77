from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import project_token
from tests.factories.http import bearer
from trainmaster import Client


@pytest.fixture
def database_url(fresh_database_url: str) -> str:
    """Each test has a migrated database of its own (copied from the session's template)."""
    return fresh_database_url


@pytest.fixture
def settings(database_url: str) -> Settings:
    # No code retention pass as each app starts: it would take the purge lock beside the tests of it.
    return Settings(database_url=database_url, code_retention_days=None)


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient]:
    """The real app in process, lifespan included."""
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def token(database_url: str) -> str:
    return project_token(database_url, "alpha")


@pytest.fixture
def other_token(database_url: str) -> str:
    return project_token(database_url, "beta")


@pytest.fixture
def auth(token: str) -> dict[str, str]:
    return bearer(token)


@pytest.fixture
def sdk(http: TestClient, token: str) -> Iterator[Client]:
    with Client("http://testserver", token, transport=http._transport) as client:
        yield client


def count_jobs(database_url: str) -> int:
    with psycopg.connect(libpq(database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM jobs").fetchone()
        assert row is not None
        return int(row[0])
