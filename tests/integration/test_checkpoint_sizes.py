"""Checkpoint sizes are measured by the platform (api/dispatcher/checkpoint_sizes.py), on real PostgreSQL and real
files: a checkpoint whose job reports 1 byte but holds 1 MiB counts 1 MiB against its project's storage
after a pass, links in it are neither followed nor counted, and a path that is not the job's counts 0."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

import trainmaster as tm
from api.db.session import create_engine, session_factory
from api.dispatcher import checkpoint_sizes
from api.settings import Settings
from tests.factories.auth import job_token, scoped_token
from tests.factories.database import project_id
from tests.factories.http import bearer, storage_rows
from tests.factories.jobs import spec

MIB = 1 << 20


def run_measure(database_url: str, storage: Path) -> int:
    async def go() -> int:
        engine = create_engine(Settings(database_url=database_url))
        try:
            return await checkpoint_sizes.measure(session_factory(engine), str(storage))
        finally:
            await engine.dispose()

    return asyncio.run(go())


def record(http: TestClient, database_url: str, job_id: str, path: Path, size: int) -> Any:
    body = {"path": str(path), "step": 1, "metrics": {}, "size_bytes": size}
    return http.post(f"/v1/jobs/{job_id}/checkpoints", json=body, headers=bearer(job_token(database_url, job_id)))


def test_a_checkpoint_reported_at_one_byte_is_counted_at_what_it_holds(
    http: TestClient, sdk: tm.Client, token: str, database_url: str, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"
    job = sdk.submit(tm.JobSpec.model_validate(spec()))
    run = storage / project_id(database_url, job.id) / job.id
    (run / "checkpoint_000000" / "shard").mkdir(parents=True)
    (run / "checkpoint_000000" / "shard" / "model.pt").write_bytes(b"w" * MIB)
    (tmp_path / "elsewhere").write_bytes(b"e" * 5 * MIB)
    (run / "checkpoint_000000" / "elsewhere").symlink_to(tmp_path / "elsewhere")  # not counted
    os.link(run / "checkpoint_000000" / "shard" / "model.pt", run / "checkpoint_000000" / "again.pt")  # once
    assert record(http, database_url, job.id, run / "checkpoint_000000", 1).status_code == 204
    assert record(http, database_url, job.id, tmp_path / "elsewhere", 7).status_code == 204  # not the job's
    assert storage_rows(http, token)["alpha"]["checkpoint_bytes"] == 8  # what the job said

    assert run_measure(database_url, storage) == 2
    assert storage_rows(http, token)["alpha"]["checkpoint_bytes"] == MIB
    listed = sdk.checkpoints(job.id)
    assert [c.size_bytes for c in listed] == [MIB, 0]
    assert run_measure(database_url, storage) == 0  # measured: not again before REMEASURE_AFTER_S

    # The quota judges the next checkpoint against the measured figure (8 bytes would have let it in).
    admin = bearer(scoped_token(database_url, "default", "admin"))
    quota = MIB + MIB // 2
    assert http.patch("/v1/projects/alpha", json={"storage_quota_bytes": quota}, headers=admin).status_code == 200
    refused = record(http, database_url, job.id, run / "checkpoint_000001", 600 * 1024)
    assert refused.status_code == 507 and "over its storage quota" in refused.json()["detail"], refused.text
