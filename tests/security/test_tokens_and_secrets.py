"""A tenant's tokens and an admin's cluster records, against the real app (in process, lifespan included)
on a real PostgreSQL: what a project token may mint and read on /metrics, that what a token mints dies
with it, that one project's streams are capped whatever tokens it mints, and that a cluster record names
only a token in the secrets folder or a reserved variable (api/clusters/token_source.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import api.dispatcher.ray_jobs
from api.app import create_app
from api.clusters import service as clusters
from api.db.models import ClusterRow
from api.settings import Settings
from tests.factories.auth import project_token, scoped_token
from tests.factories.database import sql
from tests.factories.http import bearer
from tests.factories.jobs import spec

MAX_LIFE_S = 3600.0


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    return folder


@pytest.fixture
def settings(fresh_database_url: str, secrets_dir: Path) -> Settings:
    return Settings(
        database_url=fresh_database_url,
        code_retention_days=None,
        metrics_snapshot_s=0,
        minted_token_max_life_s=MAX_LIFE_S,
        max_streams_per_project=2,
        secrets_path=str(secrets_dir),
        ray_address="http://ray-head:8265",
    )


@pytest.fixture
def http(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def admin(settings: Settings) -> dict[str, str]:
    return bearer(scoped_token(settings.database_url, "default", "admin"))


# -- metrics tokens and /metrics ---------------------------------------------------------------------------


def test_a_project_token_cannot_mint_a_metrics_token(http: TestClient, settings: Settings) -> None:
    alpha = bearer(project_token(settings.database_url, "alpha"))
    refused = http.post("/v1/tokens", json={"scope": "metrics", "description": "prom"}, headers=alpha)
    assert refused.status_code == 403, refused.text
    assert "only an admin token can create metrics tokens" in refused.json()["detail"]
    assert sql(settings.database_url, "SELECT count(*) FROM api_tokens WHERE scope = 'metrics'") == [(0,)]


def scrape(http: TestClient, headers: dict[str, str]) -> str:
    response = http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    return response.text


def test_metrics_shows_a_project_token_its_own_project_only(
    http: TestClient, settings: Settings, admin: dict[str, str]
) -> None:
    alpha = bearer(project_token(settings.database_url, "alpha"))
    beta = bearer(project_token(settings.database_url, "beta"))
    for headers in (alpha, alpha, beta):
        assert http.post("/v1/jobs", json=spec(), headers=headers).status_code == 201
    minted = http.post("/v1/tokens", json={"scope": "metrics", "project": "beta"}, headers=admin)
    assert minted.status_code == 201, minted.text

    for everything in (scrape(http, admin), scrape(http, bearer(minted.json()["token"]))):
        assert 'trainmaster_queue_depth{project="alpha"} 2.0' in everything
        assert 'trainmaster_queue_depth{project="beta"} 1.0' in everything
        assert "trainmaster_http_requests_total" in everything

    own = scrape(http, alpha)
    assert 'trainmaster_queue_depth{project="alpha"} 2.0' in own
    assert "beta" not in own  # no series, label or name of another project
    series = [line for line in own.splitlines() if line and not line.startswith("#")]
    assert series and all('project="alpha"' in line for line in series), series
    assert "trainmaster_http_requests_total" not in own and "trainmaster_jobs{" not in own  # the service's own


# -- what a token mints dies with it ----------------------------------------------------------------------


def expires_at(database_url: str, token_id: str) -> datetime:
    [(when,)] = sql(database_url, "SELECT expires_at FROM api_tokens WHERE id = %s", (token_id,))
    assert when is not None, f"token {token_id} never expires"
    return when


def token_id(database_url: str, description: str) -> str:
    return str(sql(database_url, "SELECT id FROM api_tokens WHERE description = %s", (description,))[0][0])


def mint(http: TestClient, parent: dict[str, str], **body: Any) -> dict[str, Any]:
    made = http.post("/v1/tokens", json=body, headers=parent)
    assert made.status_code == 201, made.text
    return dict(made.json())


def test_a_minted_token_never_outlives_its_parent(http: TestClient, settings: Settings, admin: dict[str, str]) -> None:
    url = settings.database_url
    parent = scoped_token(url, "alpha", "project", expires_in=timedelta(hours=1), description="parent")
    parent_expiry = expires_at(url, token_id(url, "parent"))
    at_parents = (parent_expiry - timedelta(milliseconds=1), parent_expiry)
    for body in ({"expires": False}, {"expires_in_s": 30 * 86400}, {}):
        child = mint(http, bearer(parent), **body)
        assert at_parents[0] <= expires_at(url, child["id"]) <= at_parents[1], body  # capped, never later
        grandchild = mint(http, bearer(child["token"]), expires=False)
        assert at_parents[0] <= expires_at(url, grandchild["id"]) <= at_parents[1]
    shorter = mint(http, bearer(parent), expires_in_s=60)  # a shorter life asked is kept
    assert expires_at(url, shorter["id"]) < parent_expiry - timedelta(minutes=50)

    # A parent that never expires: its children live at most minted_token_max_life_s.
    before = datetime.now(UTC)
    forever = mint(http, admin, scope="metrics", project="alpha", expires=False)
    capped = expires_at(url, forever["id"])
    assert before + timedelta(seconds=MAX_LIFE_S - 60) < capped <= datetime.now(UTC) + timedelta(seconds=MAX_LIFE_S)

    # And the cap holds in use: a child of a parent about to expire stops working with it.
    brief = scoped_token(url, "alpha", "project", expires_in=timedelta(seconds=2))
    child = bearer(mint(http, bearer(brief), expires=False)["token"])
    assert http.get("/v1/jobs", headers=child).status_code == 200
    deadline = time.monotonic() + 15
    while http.get("/v1/jobs", headers=child).status_code == 200:
        assert time.monotonic() < deadline, "the child outlived its expired parent"
        time.sleep(0.2)
    assert http.get("/v1/jobs", headers=child).status_code == 401


def test_revoking_a_token_revokes_what_it_minted_down_the_line(http: TestClient, settings: Settings) -> None:
    url = settings.database_url
    root = scoped_token(url, "alpha", "project", description="root")
    child = mint(http, bearer(root), description="child")
    grandchild = mint(http, bearer(child["token"]), description="grandchild")
    sibling = mint(http, bearer(root), description="sibling")
    bystander = project_token(url, "alpha")  # of the same project, minted by no token
    minted = [child["token"], grandchild["token"], sibling["token"]]
    for token in [root, *minted, bystander]:
        assert http.get("/v1/jobs", headers=bearer(token)).status_code == 200  # and cached from here on

    # Revoking the child takes its grandchild, not its parent or sibling.
    assert http.delete(f"/v1/tokens/{child['id']}", headers=bearer(root)).status_code == 204
    assert http.get("/v1/jobs", headers=bearer(grandchild["token"])).status_code == 401
    assert http.get("/v1/jobs", headers=bearer(sibling["token"])).status_code == 200

    # Revoking the root takes every token under it at once, cached or not; the bystander stays.
    assert http.delete(f"/v1/tokens/{token_id(url, 'root')}", headers=bearer(bystander)).status_code == 204
    for token in minted:
        assert http.get("/v1/jobs", headers=bearer(token)).status_code == 401
    assert http.get("/v1/jobs", headers=bearer(bystander)).status_code == 200
    revoked = sql(url, "SELECT description FROM api_tokens WHERE revoked_at IS NOT NULL ORDER BY description")
    assert [row[0] for row in revoked] == ["child", "grandchild", "root", "sibling"]


# -- streams per project ----------------------------------------------------------------------------------


def test_streams_are_capped_per_project_whatever_tokens_it_mints(http: TestClient, settings: Settings) -> None:
    alpha = project_token(settings.database_url, "alpha")
    job_id = http.post("/v1/jobs", json=spec(), headers=bearer(alpha)).json()["id"]
    tokens = [mint(http, bearer(alpha))["token"] for _ in range(3)]  # each far under its own cap of 16
    url = f"/v1/jobs/{job_id}/metrics/stream"
    with (
        http.stream("GET", url, headers=bearer(tokens[0])) as first,
        http.stream("GET", url, headers=bearer(tokens[1])) as second,
    ):
        assert first.status_code == second.status_code == 200
        third = http.get(f"/v1/jobs/{job_id}/logs/stream", headers=bearer(tokens[2]))
        assert third.status_code == 429 and third.headers.get("retry-after")
        detail = third.json()["detail"]
        assert "project 'alpha'" in detail and "2 open streams" in detail, detail
        assert "TRAINMASTER_MAX_STREAMS_PER_PROJECT" in detail, detail
        beta = project_token(settings.database_url, "beta")  # another project is not held up
        beta_job = http.post("/v1/jobs", json=spec(), headers=bearer(beta)).json()["id"]
        with http.stream("GET", f"/v1/jobs/{beta_job}/metrics/stream", headers=bearer(beta)) as theirs:
            assert theirs.status_code == 200
    with http.stream("GET", url, headers=bearer(tokens[2])) as again:  # closed streams free the project's slots
        assert again.status_code == 200


# -- where a cluster's Ray token may be read from ---------------------------------------------------------


def clusters_named(http: TestClient, admin: dict[str, str]) -> set[str]:
    return {c["name"] for c in http.get("/v1/clusters", headers=admin).json()["items"]}


def refused_field(http: TestClient, admin: dict[str, str], **source: str) -> str:
    body = {"name": "hostile", "address": "http://collector.example:8265", **source}
    response = http.post("/v1/clusters", json=body, headers=admin)
    assert response.status_code == 422, (source, response.text)
    [problem] = response.json()["detail"]
    return f"{problem['loc'][1]}: {problem['msg']}"


def test_a_cluster_token_source_is_the_secrets_folder_or_a_reserved_variable(
    http: TestClient, admin: dict[str, str], secrets_dir: Path, tmp_path: Path
) -> None:
    said = refused_field(http, admin, token_env="TRAINMASTER_DATABASE_URL")
    assert said.startswith("token_env:") and "TRAINMASTER_CLUSTER_TOKEN_" in said, said
    assert refused_field(http, admin, token_env="TRAINMASTER_CLUSTER_TOKEN_").startswith("token_env:")
    said = refused_field(http, admin, token_file="/etc/passwd")
    assert said.startswith("token_file:") and str(secrets_dir) in said, said
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_text("not a Ray token")
    (secrets_dir / "planted").symlink_to("/etc/passwd")
    (secrets_dir / "folder").symlink_to(outside)
    for token_file in ("planted", str(secrets_dir / "planted"), "folder/key", "../outside/key", str(outside / "key")):
        assert refused_field(http, admin, token_file=token_file).startswith("token_file:"), token_file
    assert clusters_named(http, admin) == {"default"}  # nothing refused was stored

    (secrets_dir / "gpu-a.token").write_text("ray-a\n")
    (secrets_dir / "site-b").mkdir()
    (secrets_dir / "site-b" / "token").write_text("ray-b\n")
    good = [
        {"name": "gpu-a", "token_file": "gpu-a.token"},
        {"name": "gpu-b", "token_file": str(secrets_dir / "site-b" / "token")},
        {"name": "gpu-c", "token_env": "TRAINMASTER_CLUSTER_TOKEN_GPU_C"},
        {"name": "gpu-d", "token_file": "later.token"},  # not there yet: read when used
    ]
    for body in good:
        made = http.post("/v1/clusters", json={"address": "http://ray:8265", **body}, headers=admin)
        assert made.status_code == 201, made.text
    assert clusters_named(http, admin) == {"default", "gpu-a", "gpu-b", "gpu-c", "gpu-d"}


class Dashboard:
    """Ray's dashboard as a scripted transport that records the bearer header of every request."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.host, request.headers.get("Authorization", "")))
        if request.url.path == "/api/cluster_status":
            usage = {"n1": {"CPU": [0.0, 4.0]}}
            return httpx.Response(200, json={"data": {"clusterStatus": {"loadMetricsReport": {"usageByNode": usage}}}})
        if request.url.path == "/api/v0/nodes":
            node = {"node_id": "n1", "state": "ALIVE", "node_ip": "10.0.0.1", "resources_total": {"CPU": 4}}
            return httpx.Response(200, json={"data": {"result": {"result": [node]}}})
        return httpx.Response(404)


@pytest.fixture
def dashboard(monkeypatch: pytest.MonkeyPatch) -> Dashboard:
    recorded = Dashboard()

    class Recorded(httpx.Client):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transport=httpx.MockTransport(recorded), **kwargs)

    monkeypatch.setattr(api.dispatcher.ray_jobs.httpx, "Client", Recorded)
    return recorded


def test_a_record_breaking_the_rule_is_not_used_and_says_what_to_change(
    http: TestClient,
    settings: Settings,
    admin: dict[str, str],
    secrets_dir: Path,
    tmp_path: Path,
    dashboard: Dashboard,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("API_ONLY_SECRET", "the-api-secret")
    outside = tmp_path / "outside.token"
    outside.write_text("the-outside-secret")
    (secrets_dir / "good.token").write_text("the-ray-token")
    rows = [  # as written before the rule, or by hand
        ("legacy-env", "legacy-env-head", None, "API_ONLY_SECRET"),
        ("legacy-file", "legacy-file-head", str(outside), None),
        ("swapped", "swapped-head", "swapped.token", None),
        ("good", "good-head", "good.token", None),
    ]
    for name, host, token_file, token_env in rows:
        insert = (
            "INSERT INTO clusters (id, name, address, token_file, token_env) VALUES (gen_random_uuid(), %s, %s, %s, %s)"
        )
        sql(settings.database_url, insert, (name, f"http://{host}:8265", token_file, token_env))
    (secrets_dir / "swapped.token").symlink_to(outside)  # a link put where a token was to be

    for name, field in (("legacy-env", "token_env"), ("legacy-file", "token_file"), ("swapped", "token_file")):
        info = http.get("/v1/cluster", params={"name": name}, headers=admin).json()
        assert info["reachable"] is False, info
        assert f"its {field} breaks the rule" in info["error"] and "UPDATE clusters SET" in info["error"], info
    good = http.get("/v1/cluster", params={"name": "good"}, headers=admin).json()
    assert good["reachable"] is True, good
    assert {host for host, _ in dashboard.sent} == {"good-head"}  # nothing went to the refused records' addresses
    assert {header for _, header in dashboard.sent} == {"Bearer the-ray-token"}

    # The dispatcher makes its backends with the same function: it refuses them too (and logs why).
    row = ClusterRow(name="legacy-env", address="http://legacy-env-head:8265", token_env="API_ONLY_SECRET")
    with pytest.raises(clusters.TokenSourceRefused, match="TRAINMASTER_CLUSTER_TOKEN_"):
        clusters.backend_for(row, settings.ray_address, secrets_path=settings.secrets_path)
    assert os.environ["API_ONLY_SECRET"] not in str(dashboard.sent)
