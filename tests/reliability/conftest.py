"""Fault and bad-input suite: the real app in process where that is enough, real processes where the
failure is a process's (slow readers, hostile sockets, memory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from tests.e2e.conftest import ApiProcess, start_api, stop
from tests.factories.auth import project_token


@pytest.fixture(scope="module")
def app_client(database_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=database_url)), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def tokens(database_url: str) -> dict[str, str]:
    return {"alpha": project_token(database_url, "alpha"), "beta": project_token(database_url, "beta")}


@pytest.fixture(scope="module")
def strict_api(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    """A real API process with a low stream cap and a short send timeout, for abuse tests."""
    api = start_api(
        database_url,
        tmp_path_factory.mktemp("strict") / "api.log",
        extra_env={
            "TRAINMASTER_MAX_STREAMS_PER_TOKEN": "2",
            "TRAINMASTER_SSE_SEND_TIMEOUT_S": "2",
            "TRAINMASTER_SSE_HEARTBEAT_S": "1",
        },
    )
    yield api
    stop(api.process)
