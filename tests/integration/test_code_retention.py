"""Retention of code packages: one that no job or sweep names and that was uploaded more than
`code_retention_days` ago is deleted, with its unpacked folder once no project stores that archive;
one that any job (any status) or sweep names stays, however old."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zipfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from api.code_packages import archive
from api.db.direct import OnSession
from api.db.session import create_engine, session_factory
from api.retention.service import purge_round
from api.settings import Settings
from tests.factories.database import sql
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.factories.sweeps import sweep_body

LIMITS = {"max_files": 10, "max_unpacked_bytes": 1024 * 1024}


def package(name: str) -> bytes:
    """The same bytes for the same name, whenever it is made (a fixed timestamp)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(zipfile.ZipInfo("train.py", date_time=(2026, 1, 1, 0, 0, 0)), f"print({name!r})\n")
    return buffer.getvalue()


def upload(http: TestClient, token: str, content: bytes) -> str:
    headers = {**bearer(token), "Content-Type": "application/zip"}
    response = http.post("/v1/code", content=content, headers=headers)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def age(database_url: str, code_id: str, days: int, project: str = "alpha") -> None:
    sql(
        database_url,
        "UPDATE code_packages SET created_at = now() - make_interval(days => %s)"
        " WHERE id = %s AND project_id = (SELECT id FROM projects WHERE name = %s)",
        (days, code_id, project),
    )


def stored(database_url: str) -> set[tuple[str, str]]:
    rows = sql(database_url, "SELECT p.name, c.id FROM code_packages c JOIN projects p ON p.id = c.project_id")
    return {(project, code_id) for project, code_id in rows}


def purge(database_url: str, cache: Path) -> Any:
    async def go() -> Any:
        engine = create_engine(Settings(database_url=database_url))
        try:
            return await purge_round(session_factory(engine), days=None, batch=100, code_days=30, code_cache=cache)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_unused_old_packages_go_and_used_ones_stay(
    http: TestClient, token: str, other_token: str, database_url: str, tmp_path: Path
) -> None:
    unused, by_job, by_finished_job, by_sweep, recent, shared, reuploaded = (
        upload(http, token, package(name))
        for name in ("unused", "by_job", "by_finished_job", "by_sweep", "recent", "shared", "reuploaded")
    )
    upload(http, other_token, package("shared"))  # the same archive, stored by another project too
    auth = bearer(token)
    assert http.post("/v1/jobs", json=spec(code=by_job), headers=auth).status_code == 201
    finished = http.post("/v1/jobs", json=spec(code=by_finished_job), headers=auth).json()["id"]
    sql(
        database_url,
        "UPDATE jobs SET status = 'failed', finished_at = now(), purged_at = now() WHERE id = %s",
        (finished,),
    )
    response = http.post("/v1/sweeps", json=sweep_body(spec={**sweep_body()["spec"], "code": by_sweep}), headers=auth)
    assert response.status_code == 201, response.text
    sql(database_url, "DELETE FROM jobs WHERE spec->>'code' = %s", (by_sweep,))  # only the sweep names it now
    for code_id in (unused, by_job, by_finished_job, by_sweep, shared, reuploaded):
        age(database_url, code_id, 31)
    age(database_url, recent, 29)
    upload(http, token, package("reuploaded"))  # uploading it again restarts its clock
    cache = tmp_path / "code"
    for name in ("unused", "by_job", "shared"):
        content = package(name)
        archive.unpacked(cache, "sha256:" + hashlib.sha256(content).hexdigest(), content, **LIMITS)
    before = stored(database_url)

    purged = purge(database_url, cache)

    assert before - stored(database_url) == {("alpha", unused), ("alpha", shared)}
    assert purged.code_packages == 2
    assert stored(database_url) == before - {("alpha", unused), ("alpha", shared)}
    assert sorted(p.name for p in cache.iterdir()) == sorted(c.removeprefix("sha256:") for c in (by_job, shared))
    assert purge(database_url, cache).code_packages == 0  # done once


def test_the_api_purges_code_without_retention_days(
    settings: Settings, token: str, database_url: str, tmp_path: Path
) -> None:
    """Code retention runs in the API's retention pass even when points and logs are kept forever."""
    settings = settings.model_copy(update={"code_cache_path": str(tmp_path), "code_retention_days": 30})
    with TestClient(create_app(settings)) as http:
        code_id = upload(http, token, package("old"))
    age(database_url, code_id, 31)
    assert settings.retention_days is None
    with TestClient(create_app(settings)):  # its first retention round runs as it starts
        deadline = time.monotonic() + 30
        while stored(database_url) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert stored(database_url) == set()


def test_a_package_named_by_a_new_job_is_not_purged_before_the_job_is_stored(
    http: TestClient, token: str, database_url: str, tmp_path: Path
) -> None:
    """The submit's check that the package exists also restarts its clock: retention, running between
    that check and the job's insert, finds it young and keeps it (before, it deleted it and the job
    was stored naming a package that was gone)."""
    from api.code_packages import repository

    code_id = upload(http, token, package("named"))
    age(database_url, code_id, 40)

    async def check_only() -> bool:
        engine = create_engine(Settings(database_url=database_url))
        try:
            async with session_factory(engine)() as session, session.begin():
                project = sql(database_url, "SELECT id FROM projects WHERE name = 'alpha'")[0][0]
                return await repository.exists(OnSession(session), project, code_id)
        finally:
            await engine.dispose()

    assert asyncio.run(check_only())  # a job is about to name it: its insert comes next
    purge(database_url, tmp_path / "cache")
    assert ("alpha", code_id) in stored(database_url)
    body = {**spec(), "code": code_id}
    response = http.post("/v1/jobs", json=body, headers=bearer(token))
    assert response.status_code == 201, response.text
