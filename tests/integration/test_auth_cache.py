"""The token cache (api/auth/cache.py) through the real app: a checked token is not looked up again,
and a revoked or deleted token is refused by the very next request, whichever way it was revoked."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from api.auth.cache import TokenCache
from api.auth.service import hash_token
from tests.factories.auth import job_token
from tests.factories.database import sql
from tests.factories.http import bearer
from tests.factories.jobs import spec


def cache_of(http: TestClient) -> TokenCache:
    tokens: TokenCache = http.app.state.tokens  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not tokens.listening:  # the broker connects in the background at start-up
        assert time.monotonic() < deadline, "the broker never listened"
        time.sleep(0.02)
    return tokens


def test_a_checked_token_is_served_from_the_cache(http: TestClient, token: str) -> None:
    tokens = cache_of(http)
    assert http.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert hash_token(token) in tokens.entries
    hits = tokens.hits
    assert http.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert tokens.hits == hits + 1  # the entry, not a query


REVOCATIONS: dict[str, Callable[[str, str], object]] = {
    "revoked_at set": lambda url, token: sql(
        url, "UPDATE api_tokens SET revoked_at = now() WHERE token_hash = %s", (hash_token(token),)
    ),
    "token deleted": lambda url, token: sql(url, "DELETE FROM api_tokens WHERE token_hash = %s", (hash_token(token),)),
    "project deleted": lambda url, token: sql(
        url,
        "DELETE FROM projects WHERE id = (SELECT project_id FROM api_tokens WHERE token_hash = %s)",
        (hash_token(token),),
    ),
    "table truncated": lambda url, token: sql(url, "TRUNCATE api_tokens CASCADE"),
}


@pytest.mark.parametrize("how", list(REVOCATIONS))
def test_revocation_beats_the_cache_at_once(http: TestClient, token: str, database_url: str, how: str) -> None:
    cache_of(http)
    for _ in range(3):
        assert http.get("/v1/jobs", headers=bearer(token)).status_code == 200
    REVOCATIONS[how](database_url, token)
    assert http.get("/v1/jobs", headers=bearer(token)).status_code == 401  # the next request, no wait


def test_a_job_token_revoked_by_the_dispatcher_is_refused_at_once(
    http: TestClient, auth: dict[str, str], database_url: str
) -> None:
    import asyncio

    from api.db.session import create_engine, session_factory
    from api.dispatcher.repository import revoke_job_tokens
    from api.settings import Settings

    cache_of(http)
    job_id = http.post("/v1/jobs", json=spec(), headers=auth).json()["id"]
    secret = job_token(database_url, job_id)
    points = {"points": [{"step": 1, "values": {"loss": 1.0}}]}
    for _ in range(3):
        assert http.post(f"/v1/jobs/{job_id}/metrics", json=points, headers=bearer(secret)).status_code == 201

    async def revoke() -> None:  # as the reconcile loop does when an attempt ends
        engine = create_engine(Settings(database_url=database_url))
        async with session_factory(engine)() as session, session.begin():
            await revoke_job_tokens(session, uuid.UUID(job_id))
        await engine.dispose()

    asyncio.run(revoke())
    assert http.post(f"/v1/jobs/{job_id}/metrics", json=points, headers=bearer(secret)).status_code == 401


def test_without_the_listener_every_request_asks_the_database(http: TestClient, token: str, database_url: str) -> None:
    tokens = cache_of(http)
    assert http.get("/v1/jobs", headers=bearer(token)).status_code == 200
    tokens.listener_down()  # as when the LISTEN connection is lost: nothing cached is trusted
    try:
        sql(database_url, "ALTER TABLE api_tokens DISABLE TRIGGER tm_token_revoked")  # no notice this time
        sql(database_url, "UPDATE api_tokens SET revoked_at = now() WHERE token_hash = %s", (hash_token(token),))
        assert http.get("/v1/jobs", headers=bearer(token)).status_code == 401
    finally:
        sql(database_url, "ALTER TABLE api_tokens ENABLE TRIGGER tm_token_revoked")
        tokens.listener_up()
