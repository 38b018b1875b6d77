"""Storage quota per project (issue 30), on a real PostgreSQL through the real API: what a project stores
(live checkpoints as their jobs measured them, code packages) is kept by migration 0019's triggers as
rows come and go; above the quota a new checkpoint is refused (507, listed as deleted with why, an
event on its job) and an upload is refused (507, nothing stored); another project goes on; what the
collector deletes frees the quota again. The job side (the controller's callback removing a refused
checkpoint's files) is tested in tests/unit/test_storage_callback.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import psycopg
from fastapi.testclient import TestClient

import trainmaster as tm
from api.settings import libpq_url as libpq
from tests.factories.auth import job_token, scoped_token
from tests.factories.checkpoints import run_collector
from tests.factories.code import make_zip, upload
from tests.factories.http import bearer, storage_rows
from tests.factories.jobs import spec


def record(http: TestClient, database_url: str, job_id: str, name: str, size: int) -> Any:
    """The job's callback recording a checkpoint Ray Train wrote, with its job token."""
    body = {"path": f"/storage/{job_id}/{name}", "step": 1, "metrics": {}, "size_bytes": size}
    return http.post(f"/v1/jobs/{job_id}/checkpoints", json=body, headers=bearer(job_token(database_url, job_id)))


def test_a_project_over_its_storage_quota_is_refused_new_checkpoints_and_uploads_and_nothing_else(
    http: TestClient, sdk: tm.Client, token: str, other_token: str, database_url: str, tmp_path: Path
) -> None:
    admin = scoped_token(database_url, "default", "admin")
    code = make_zip({"train.py": b"print('hi')\n" * 20})
    assert upload(http, bearer(token), code).status_code == 201
    job = sdk.submit(tm.JobSpec.model_validate(spec(checkpoint={"num_to_keep": 1})))
    quota = len(code) + 600
    set_quota = http.patch("/v1/projects/alpha", json={"storage_quota_bytes": quota}, headers=bearer(admin))
    assert set_quota.status_code == 200 and set_quota.json()["storage_quota_bytes"] == quota, set_quota.text

    assert record(http, database_url, job.id, "checkpoint_000000", 500).status_code == 204
    alpha = storage_rows(http, token)["alpha"]
    assert (alpha["checkpoints"], alpha["checkpoint_bytes"], alpha["code_bytes"]) == (1, 500, len(code))
    assert alpha["used_bytes"] == len(code) + 500 and alpha["quota_bytes"] == quota

    refused = record(http, database_url, job.id, "checkpoint_000001", 200)  # 100 B over
    assert refused.status_code == 507, refused.text
    assert refused.json()["error"] == "StorageQuotaExceeded"
    assert "project 'alpha' is over its storage quota" in refused.json()["detail"]
    assert "trainmaster project set alpha --storage-quota" in refused.json()["detail"]
    listed = sdk.checkpoints(job.id)
    assert [c.deleted_at is None for c in listed] == [True, False]
    assert (listed[1].deleted_why or "").startswith("refused: project 'alpha' is over its storage quota")
    events = [e for e in sdk.events(job.id) if e.kind == "checkpoint_refused"]
    assert len(events) == 1 and events[0].data["size_bytes"] == 200, events
    assert storage_rows(http, token)["alpha"]["checkpoint_bytes"] == 500  # the refused one never counted

    bigger = make_zip({"train.py": b"x = 1\n" * 400})
    over = upload(http, bearer(token), bigger)
    assert over.status_code == 507 and "over its storage quota" in over.json()["detail"], over.text
    digest = "sha256:" + hashlib.sha256(bigger).hexdigest()
    assert http.head(f"/v1/code/{digest}", headers=bearer(token)).status_code == 404  # nothing stored
    again = upload(http, bearer(token), code)  # stored already: adds nothing, so accepted
    assert again.status_code == 201, again.text
    assert storage_rows(http, token)["alpha"]["code_bytes"] == len(code)

    # Another project, without a quota, goes on; each project token sees its own, an admin all.
    neighbour = tm.JobSpec.model_validate(spec(name="b"))
    other = http.post("/v1/jobs", json=neighbour.model_dump(mode="json"), headers=bearer(other_token)).json()
    assert record(http, database_url, other["id"], "checkpoint_000000", 10**9).status_code == 204
    assert set(storage_rows(http, other_token)) == {"beta"}
    everyone = storage_rows(http, admin)
    assert everyone["beta"]["checkpoint_bytes"] == 10**9 and everyone["beta"]["quota_bytes"] is None

    # What the collector deletes frees the quota: a second checkpoint within it, then the first is
    # not among the job's latest 1 any more.
    assert record(http, database_url, job.id, "checkpoint_000002", 100).status_code == 204
    assert storage_rows(http, token)["alpha"]["checkpoint_bytes"] == 600
    (tmp_path / "storage").mkdir()
    assert run_collector(database_url, tmp_path / "storage").marked == 1
    alpha = storage_rows(http, token)["alpha"]
    assert (alpha["checkpoints"], alpha["checkpoint_bytes"]) == (1, 100)
    assert record(http, database_url, job.id, "checkpoint_000003", 400).status_code == 204

    lifted = http.patch("/v1/projects/alpha", json={"storage_quota_bytes": None}, headers=bearer(admin))
    assert lifted.status_code == 200 and lifted.json()["storage_quota_bytes"] is None
    assert record(http, database_url, job.id, "checkpoint_000004", 10**12).status_code == 204


def test_the_triggers_agree_with_a_full_count(http: TestClient, sdk: tm.Client, token: str, database_url: str) -> None:
    """Bulk inserts, updates and deletes of checkpoints and code packages, then the maintained figures
    against a count of the rows."""
    jobs = [sdk.submit(tm.JobSpec.model_validate(spec(name=f"j{i}"))).id for i in range(3)]
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO checkpoints (job_id, path, size_bytes)"
            " SELECT (ARRAY[%s, %s, %s]::uuid[])[1 + n %% 3], '/c/' || n, n * 10 FROM generate_series(1, 300) n",
            jobs,
        )
        conn.execute("UPDATE checkpoints SET deleted_at = now() WHERE size_bytes % 70 = 0")
        conn.execute("UPDATE checkpoints SET size_bytes = size_bytes + 1 WHERE size_bytes % 30 = 0")
        conn.execute("UPDATE checkpoints SET pinned = true WHERE size_bytes % 11 = 0")  # changes nothing counted
        conn.execute("DELETE FROM checkpoints WHERE size_bytes % 50 = 0")
        conn.execute(
            "INSERT INTO code_packages (project_id, id, size, file_count, content)"
            " SELECT project_id, 'sha256:' || n, n, 1, '' FROM jobs, generate_series(1, 5) n WHERE jobs.id = %s",
            (jobs[0],),
        )
        conn.execute("DELETE FROM code_packages WHERE size = 2")
        counted = conn.execute(
            """
            SELECT (SELECT coalesce(sum(c.size_bytes), 0) FROM checkpoints c WHERE c.deleted_at IS NULL),
                   (SELECT count(*) FROM checkpoints c WHERE c.deleted_at IS NULL),
                   (SELECT coalesce(sum(size), 0) FROM code_packages)
            """
        ).fetchone()
    alpha = storage_rows(http, token)["alpha"]
    assert counted is not None and counted[1] > 0
    assert (alpha["checkpoint_bytes"], alpha["checkpoints"], alpha["code_bytes"]) == tuple(int(x) for x in counted)


def test_a_storage_quota_must_be_a_size(http: TestClient, database_url: str) -> None:
    admin = bearer(scoped_token(database_url, "default", "admin"))
    http.post("/v1/projects", json={"name": "gamma"}, headers=admin)
    for bad in (-1, "lots", 2**61):
        answer = http.patch("/v1/projects/gamma", json={"storage_quota_bytes": bad}, headers=admin)
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][-1] == "storage_quota_bytes", bad
    assert http.get("/v1/projects/gamma", headers=admin).json()["storage_quota_bytes"] is None  # nothing changed
