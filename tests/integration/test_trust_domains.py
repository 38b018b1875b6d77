"""Clusters and projects as records, token scopes, token life, the priority bound and /metrics, through
the real app (in process, lifespan included) on a real PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from api.app import create_app
from api.settings import Settings
from api.settings import libpq_url as libpq
from tests.factories.auth import job_token, scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import spec


@pytest.fixture
def tokens(database_url: str, token: str) -> dict[str, dict[str, str]]:
    """One caller of each scope: admin (of project default), project (alpha), metrics (alpha)."""
    return {
        "admin": bearer(scoped_token(database_url, "default", "admin")),
        "project": bearer(token),
        "metrics": bearer(scoped_token(database_url, "alpha", "metrics")),
    }


def locs(response: Any) -> list[list[Any]]:
    return [item["loc"] for item in response.json()["detail"]]


def test_migration_binds_every_project_to_the_default_cluster(http: TestClient, tokens: dict[str, Any]) -> None:
    clusters = http.get("/v1/clusters", headers=tokens["admin"]).json()["items"]
    assert [cluster["name"] for cluster in clusters] == ["default"]
    assert clusters[0]["address"] == Settings().ray_address
    projects = {p["name"]: p for p in http.get("/v1/projects", headers=tokens["admin"]).json()["items"]}
    # alpha was made implicitly (get_or_create_project, as `token create` does): on default, today's range.
    assert projects["alpha"]["cluster"] == "default"
    assert projects["alpha"]["max_priority"] == 100


def test_admin_creates_clusters_and_projects_and_moves_them(http: TestClient, tokens: dict[str, Any]) -> None:
    admin = tokens["admin"]
    ray_a = "TRAINMASTER_CLUSTER_TOKEN_RAY_A"  # a cluster's token variable carries the reserved prefix
    body = {"name": "gpu-a", "address": "http://ray-a:8265", "token_env": ray_a, "labels": {"site": "a"}}
    created = http.post("/v1/clusters", json=body, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["token_env"] == ray_a and created.json()["labels"] == {"site": "a"}
    assert http.post("/v1/clusters", json=body, headers=admin).status_code == 409

    project = http.post("/v1/projects", json={"name": "vision", "cluster": "gpu-a", "max_priority": 10}, headers=admin)
    assert project.status_code == 201, project.text
    assert project.json()["cluster"] == "gpu-a" and project.json()["max_priority"] == 10
    assert http.post("/v1/projects", json={"name": "vision"}, headers=admin).status_code == 409
    assert http.get("/v1/projects/vision", headers=admin).json()["cluster"] == "gpu-a"

    moved = http.patch("/v1/projects/vision", json={"cluster": "default", "max_priority": 20}, headers=admin)
    assert moved.status_code == 200 and moved.json()["cluster"] == "default" and moved.json()["max_priority"] == 20
    assert http.patch("/v1/projects/nope", json={"max_priority": 1}, headers=admin).status_code == 404


def test_bad_cluster_and_project_bodies_are_422_naming_the_field(http: TestClient, tokens: dict[str, Any]) -> None:
    admin = tokens["admin"]
    cases = [
        ("/v1/clusters", {"name": "x", "address": "http://a", "token_file": "/t", "token_env": "T"}, "token_env"),
        ("/v1/clusters", {"name": "x"}, "address"),
        ("/v1/clusters", {"name": "bad name", "address": "http://a"}, "name"),
        ("/v1/clusters", {"name": "x", "address": "http://a", "token": "secret"}, "token"),
        ("/v1/projects", {"name": "p", "cluster": "missing"}, "cluster"),
        ("/v1/projects", {"name": "p", "max_priority": 101}, "max_priority"),
        ("/v1/projects", {"name": ""}, "name"),
    ]
    for path, body, field in cases:
        response = http.post(path, json=body, headers=admin)
        assert response.status_code == 422, (body, response.text)
        assert ["body", field] in locs(response), (body, response.json())
    response = http.patch("/v1/projects/alpha", json={"cluster": "missing"}, headers=admin)
    assert response.status_code == 422 and locs(response) == [["body", "cluster"]]


def test_scope_matrix_on_the_admin_routes(
    http: TestClient, tokens: dict[str, Any], other_token: str, database_url: str
) -> None:
    job = http.post("/v1/jobs", json=spec(), headers=tokens["project"]).json()
    callers = {**tokens, "job": bearer(job_token(database_url, job["id"])), "none": {}}
    admin_only = [
        ("POST", "/v1/clusters", {"name": "c", "address": "http://c"}),
        ("GET", "/v1/clusters", None),
        ("POST", "/v1/projects", {"name": "p2"}),
        ("PATCH", "/v1/projects/alpha", {"max_priority": 50}),
    ]
    expected = {"admin": None, "project": 403, "metrics": 403, "job": 401, "none": 401}
    for method, path, body in admin_only:
        for who, headers in callers.items():
            status = http.request(method, path, json=body, headers=headers).status_code
            if expected[who] is None:
                assert status in (200, 201), (who, method, path, status)
            else:
                assert status == expected[who], (who, method, path, status)
    # Reads: a project token sees its own project, never another's (404, not 403: nothing revealed).
    assert [p["name"] for p in http.get("/v1/projects", headers=tokens["project"]).json()["items"]] == ["alpha"]
    assert http.get("/v1/projects/alpha", headers=tokens["project"]).status_code == 200
    assert http.get("/v1/projects/beta", headers=tokens["project"]).status_code == 404
    assert http.get("/v1/projects/beta", headers=tokens["admin"]).status_code == 200
    for who, status in (("metrics", 403), ("job", 401), ("none", 401)):
        assert http.get("/v1/projects", headers=callers[who]).status_code == status, who
        assert http.get("/v1/tokens", headers=callers[who]).status_code == status, who
        assert http.get("/v1/jobs", headers=callers[who]).status_code == status, who
    # A metrics token writes nothing either, not even through the fast lane.
    assert http.post("/v1/jobs", json=spec(), headers=tokens["metrics"]).status_code == 403
    batch = {"points": [{"step": 1, "values": {"loss": 1.0}}]}
    assert http.post(f"/v1/jobs/{job['id']}/metrics", json=batch, headers=tokens["metrics"]).status_code == 403
    # The admin token is also its own project's token (`trainmaster up` writes one to the config).
    submitted = http.post("/v1/jobs", json=spec(), headers=tokens["admin"])
    assert submitted.status_code == 201 and submitted.json()["project"] == "default"


def test_tokens_listed_created_and_revoked_by_scope(http: TestClient, tokens: dict[str, Any], other_token: str) -> None:
    admin, project = tokens["admin"], tokens["project"]
    mine = {t["scope"] for t in http.get("/v1/tokens", headers=project).json()["items"]}
    assert mine == {"project", "metrics"}  # alpha's own; never the admin's, never beta's
    everyone = http.get("/v1/tokens", headers=admin).json()["items"]
    assert {t["project"] for t in everyone} >= {"alpha", "beta", "default"}

    # A metrics token reads every project's figures: only an admin mints one (for any project).
    assert http.post("/v1/tokens", json={"scope": "metrics"}, headers=project).status_code == 403
    made = http.post("/v1/tokens", json={"scope": "metrics", "project": "alpha", "description": "prom"}, headers=admin)
    assert made.status_code == 201 and made.json()["project"] == "alpha" and made.json()["expires_at"] is not None
    assert http.get("/metrics", headers=bearer(made.json()["token"])).status_code == 200
    assert http.post("/v1/tokens", json={"scope": "admin"}, headers=project).status_code == 403
    assert http.post("/v1/tokens", json={"project": "beta"}, headers=project).status_code == 403
    assert locs(http.post("/v1/tokens", json={"scope": "job"}, headers=admin)) == [["body", "scope"]]
    assert locs(http.post("/v1/tokens", json={"project": "nope"}, headers=admin)) == [["body", "project"]]
    project_made = http.post("/v1/tokens", json={"user": "ana"}, headers=admin).json()
    assert project_made["scope"] == "project" and project_made["user"] == "ana"
    assert project_made["expires_at"] is not None  # project tokens: 90 days unless told

    beta_id = next(t["id"] for t in everyone if t["project"] == "beta")
    assert http.delete(f"/v1/tokens/{beta_id}", headers=project).status_code == 404  # another project's
    assert http.delete(f"/v1/tokens/{made.json()['id']}", headers=project).status_code == 204
    assert http.get("/metrics", headers=bearer(made.json()["token"])).status_code == 401  # at once
    assert http.delete(f"/v1/tokens/{beta_id}", headers=admin).status_code == 204
    assert http.get("/v1/jobs", headers=bearer(other_token)).status_code == 401
    assert http.delete("/v1/tokens/not-a-uuid", headers=admin).status_code == 404


def test_an_expired_token_is_401_even_when_cached(http: TestClient, database_url: str) -> None:
    short = scoped_token(database_url, "alpha", "project", expires_in=timedelta(seconds=2))
    assert http.get("/v1/jobs", headers=bearer(short)).status_code == 200  # cached from here on
    deadline = time.monotonic() + 10
    while http.get("/v1/jobs", headers=bearer(short)).status_code == 200:
        assert time.monotonic() < deadline, "the expired token is still accepted"
        time.sleep(0.2)
    response = http.get("/v1/jobs", headers=bearer(short))
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_last_used_at_is_written_once_a_minute_at_most(http: TestClient, token: str, database_url: str) -> None:
    def last_used() -> Any:
        with psycopg.connect(libpq(database_url)) as conn:
            row = conn.execute("SELECT last_used_at FROM api_tokens WHERE scope = 'project' AND job_id IS NULL")
            return row.fetchone()[0]  # type: ignore[index]

    assert last_used() is None
    http.get("/v1/jobs", headers=bearer(token))
    deadline = time.monotonic() + 5
    while (first := last_used()) is None:
        assert time.monotonic() < deadline, "last_used_at never written"
        time.sleep(0.05)
    for _ in range(20):
        http.get("/v1/jobs", headers=bearer(token))
    time.sleep(0.3)
    assert last_used() == first  # not on every request
    listed = http.get("/v1/tokens", headers=bearer(token)).json()["items"]
    assert listed[0]["last_used_at"] is not None


def test_priority_above_the_projects_max_is_422_naming_the_limit(http: TestClient, tokens: dict[str, Any]) -> None:
    admin, project = tokens["admin"], tokens["project"]
    assert http.post("/v1/jobs", json=spec(priority=100), headers=project).status_code == 201  # today's range
    assert http.patch("/v1/projects/alpha", json={"max_priority": 5}, headers=admin).status_code == 200
    refused = http.post("/v1/jobs", json=spec(priority=6), headers=project)  # the project change evicts the cache
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "priority"]
    assert "at most 5" in refused.json()["detail"][0]["msg"]
    accepted = http.post("/v1/jobs", json=spec(priority=5), headers=project)
    assert accepted.status_code == 201 and accepted.json()["cluster"] == "default"
    sweep = {
        "name": "s",
        "spec": spec(priority=50),
        "parameters": {"lr": {"values": [0.1, 0.2]}},
        "metric": "loss",
        "mode": "min",
    }
    refused = http.post("/v1/sweeps", json=sweep, headers=project)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "spec", "priority"]


def test_jobs_carry_their_projects_cluster(http: TestClient, tokens: dict[str, Any]) -> None:
    admin, project = tokens["admin"], tokens["project"]
    http.post("/v1/clusters", json={"name": "gpu-b", "address": "http://ray-b:8265"}, headers=admin)
    job = http.post("/v1/jobs", json=spec(), headers=project).json()
    assert job["cluster"] == "default"
    assert http.patch("/v1/projects/alpha", json={"cluster": "gpu-b"}, headers=admin).status_code == 200
    assert http.get(f"/v1/jobs/{job['id']}", headers=project).json()["cluster"] == "gpu-b"
    assert http.get("/v1/jobs", headers=project).json()["items"][0]["cluster"] == "gpu-b"


def test_metrics_needs_a_token(http: TestClient, tokens: dict[str, Any]) -> None:
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=bearer("tm_nope")).status_code == 401
    assert http.get("/metrics", headers=tokens["project"]).status_code == 200  # its own project's series only
    assert http.get("/metrics", headers=tokens["metrics"]).status_code == 200
    assert http.get("/metrics", headers=tokens["admin"]).status_code == 200


def test_metrics_public_serves_without_a_token(database_url: str) -> None:
    settings = Settings(database_url=database_url, code_retention_days=None, metrics_public=True)
    with TestClient(create_app(settings)) as http:
        assert http.get("/metrics").status_code == 200


def test_metrics_reads_the_database_once_per_snapshot_whatever_the_scrape_rate(database_url: str, token: str) -> None:
    settings = Settings(database_url=database_url, code_retention_days=None, metrics_public=True)
    statements: list[str] = []
    app = create_app(settings)
    with TestClient(app) as http:
        event.listen(app.state.engine.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        http.post("/v1/jobs", json=spec(), headers=bearer(token))  # the fast lane: no ORM statement
        statements.clear()
        texts = [http.get("/metrics").text for _ in range(30)]
        assert len(statements) == 1, statements  # one statement for 30 scrapes
        assert all('trainmaster_jobs{status="queued"} 1.0' in text for text in texts)
        snapshot = app.state.platform_snapshot
        snapshot.read_at -= settings.metrics_snapshot_s  # ten seconds later
        http.get("/metrics")
        assert len(statements) == 2 and snapshot.reads == 2
