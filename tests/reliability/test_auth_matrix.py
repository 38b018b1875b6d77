"""Case 8: every endpoint, SSE, logs, cancel and ingest included, against every kind of caller.

No token or a bad one: 401. Another project's token: 404 (never revealing the job exists). A project
token on an admin route (clusters, creating and changing projects): 403; a metrics token anywhere but
/metrics: 403.
A job token: writes only its own job (metrics, events, checkpoints), reads only its own job's
control flags (what `trainmaster.should_checkpoint()` asks), and nothing else.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.factories.auth import job_token, scoped_token
from tests.factories.http import bearer
from tests.factories.jobs import spec

JOB_WRITES = {
    ("POST", "/v1/jobs/{job_id}/metrics"),
    ("POST", "/v1/jobs/{job_id}/events"),
    ("POST", "/v1/jobs/{job_id}/checkpoints"),
}
JOB_READS = {("GET", "/v1/jobs/{job_id}/control")}
PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
CLAIM = "/v1/tokens/claim"  # its credential is the claim in the body, not a bearer token: tested on its own

BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/jobs"): spec(),
    ("POST", "/v1/jobs/{job_id}/metrics"): {"points": [{"step": 1, "values": {"loss": 1.0}}]},
    ("POST", "/v1/jobs/{job_id}/events"): {"kind": "note", "message": "hello"},
    ("POST", "/v1/jobs/{job_id}/checkpoints"): {"path": "/ckpt/1", "step": 1},
    ("POST", "/v1/clusters"): {"name": "matrix", "address": "http://ray-matrix:8265"},
    ("POST", "/v1/projects"): {"name": "matrix"},
    ("PATCH", "/v1/projects/{name}"): {"max_priority": 100},
    ("POST", "/v1/tokens"): {"scope": "metrics"},
    ("POST", "/v1/sweeps"): {
        "name": "matrix",
        "spec": spec(),
        "parameters": {"lr": {"values": [0.1, 0.01]}},
        "metric": "loss",
        "mode": "min",
    },
}


def endpoints(client: TestClient) -> list[tuple[str, str]]:
    """Every operation the API documents (the OpenAPI schema is generated from the routes)."""
    paths = client.get("/openapi.json").json()["paths"]
    return [
        (method.upper(), path) for path, ops in paths.items() if path not in PUBLIC | {CLAIM} for method in sorted(ops)
    ]


def call(client: TestClient, method: str, path: str, job_id: str, headers: dict[str, str]) -> int:
    url = path.replace("{job_id}", job_id).replace("{sweep_id}", str(uuid.UUID(int=7)))
    url = url.replace("{name}", "alpha").replace("{token_id}", str(uuid.UUID(int=9))).replace("{checkpoint_id}", "1")
    body = BODIES.get((method, path))
    if path == "/v1/code":
        return client.post(
            url, content=b"PK\x05\x06" + b"\0" * 18, headers={**headers, "Content-Type": "application/zip"}
        ).status_code
    if body is not None:
        return client.request(method, url, json=body, headers=headers).status_code
    if path.endswith("/stream"):
        with client.stream(method, url, headers=headers) as response:
            return response.status_code  # only the status is read: the stream is closed at once
    return client.request(method, url, headers=headers).status_code


@pytest.fixture(scope="module")
def jobs(app_client: TestClient, tokens: dict[str, str]) -> dict[str, str]:
    made = {}
    for name in ("mine", "other"):
        response = app_client.post("/v1/jobs", json=spec(name=name), headers=bearer(tokens["alpha"]))
        made[name] = response.json()["id"]
    return made


def test_every_endpoint_is_covered(app_client: TestClient) -> None:
    covered = {path for _, path in endpoints(app_client)}
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/metrics/stream",
        "/v1/jobs/{job_id}/logs",
        "/v1/jobs/{job_id}/logs/stream",
        "/v1/code",
    } <= covered


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("tm_not-a-token"), {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Bearer"}],
    ids=["none", "bad", "basic", "empty"],
)
def test_no_or_bad_token_is_401_everywhere(
    app_client: TestClient, jobs: dict[str, str], headers: dict[str, str]
) -> None:
    for method, path in endpoints(app_client):
        assert call(app_client, method, path, jobs["mine"], headers) == 401, (method, path)


def test_another_project_gets_404_for_every_job_route(
    app_client: TestClient, jobs: dict[str, str], tokens: dict[str, str]
) -> None:
    for method, path in endpoints(app_client):
        if "{job_id}" in path:
            assert call(app_client, method, path, jobs["mine"], bearer(tokens["beta"])) == 404, (method, path)


def test_job_token_writes_its_own_job_only_and_reads_nothing(
    app_client: TestClient, jobs: dict[str, str], database_url: str
) -> None:
    token = bearer(job_token(database_url, jobs["mine"]))
    for method, path in endpoints(app_client):
        own = call(app_client, method, path, jobs["mine"], token)
        if (method, path) in JOB_WRITES | JOB_READS:
            assert own in (200, 201, 204), (method, path, own)
            assert call(app_client, method, path, jobs["other"], token) == 404, (method, path)
        else:
            assert own == 401, (method, path, own)


ADMIN_ONLY = {
    ("POST", "/v1/clusters"),
    ("GET", "/v1/clusters"),
    ("POST", "/v1/projects"),
    ("PATCH", "/v1/projects/{name}"),
}


def test_a_metrics_token_is_refused_everywhere_but_metrics(
    app_client: TestClient, jobs: dict[str, str], database_url: str
) -> None:
    token = bearer(scoped_token(database_url, "alpha", "metrics"))
    for method, path in endpoints(app_client):
        assert call(app_client, method, path, jobs["mine"], token) == 403, (method, path)
    assert app_client.get("/metrics", headers=token).status_code == 200


def test_admin_routes_refuse_project_tokens_and_admit_admin_tokens(
    app_client: TestClient, jobs: dict[str, str], tokens: dict[str, str], database_url: str
) -> None:
    admin = bearer(scoped_token(database_url, "default", "admin"))
    listed = {(method, path) for method, path in endpoints(app_client)}
    assert listed >= ADMIN_ONLY
    for method, path in sorted(ADMIN_ONLY):
        assert call(app_client, method, path, jobs["mine"], bearer(tokens["alpha"])) == 403, (method, path)
        assert call(app_client, method, path, jobs["mine"], admin) in (200, 201, 409), (method, path)
    # /metrics: a project token reads its own project's series only (tests/security/test_tokens_and_secrets.py)
    assert app_client.get("/metrics", headers=bearer(tokens["alpha"])).status_code == 200
    assert app_client.post("/v1/tokens", json={"scope": "metrics"}, headers=bearer(tokens["alpha"])).status_code == 403


def test_the_claim_route_refuses_a_bad_claim_whatever_token_comes_with_it(
    app_client: TestClient, jobs: dict[str, str], tokens: dict[str, str], database_url: str
) -> None:
    assert CLAIM in app_client.get("/openapi.json").json()["paths"]
    admin = bearer(scoped_token(database_url, "default", "admin"))
    for headers in ({}, bearer(tokens["alpha"]), admin, bearer(job_token(database_url, jobs["mine"]))):
        body = {"job_id": jobs["mine"], "claim": "tm_not-a-claim"}
        assert app_client.post(CLAIM, json=body, headers=headers).status_code == 401, headers


def test_unknown_job_ids_are_404_not_500(app_client: TestClient, tokens: dict[str, str]) -> None:
    for method, path in endpoints(app_client):
        if "{job_id}" in path:
            for job_id in (str(uuid.uuid4()), "not-a-uuid", "0"):
                assert call(app_client, method, path, job_id, bearer(tokens["alpha"])) == 404, (method, path)
