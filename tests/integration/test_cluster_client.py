"""GET /v1/cluster reads Ray through one client per cluster and API process, made on first use and
closed when the app shuts down; each cluster with its own address and token. Ray's dashboard is a
scripted httpx transport: no Ray needed."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import api.clusters.service
import api.dispatcher.ray_jobs
from api.app import create_app
from api.auth import admin
from api.auth.principal import Scope
from api.settings import Settings
from tests.factories.http import bearer

REQUESTS = 25


OTHER_TOKEN = "other-cluster-secret"


def dashboard(request: httpx.Request) -> httpx.Response:
    """Two nodes of 4 CPUs, one CPU in use on the first; the head `other-head` (the cluster `other`)
    has one node of 16, and answers only its own token."""
    nodes = {"n1": [1.0, 4.0], "n2": [0.0, 4.0]}
    if request.url.host == "other-head":
        if request.headers.get("Authorization") != f"Bearer {OTHER_TOKEN}":
            return httpx.Response(401)
        nodes = {"big": [0.0, 16.0]}
    if request.url.path == "/api/cluster_status":
        usage = {node: {"CPU": pair} for node, pair in nodes.items()}
        return httpx.Response(200, json={"data": {"clusterStatus": {"loadMetricsReport": {"usageByNode": usage}}}})
    if request.url.path == "/api/v0/nodes":
        states = [{"node_id": n, "state": "ALIVE", "node_ip": "10.0.0.1", "resources_total": {"CPU": 4}} for n in nodes]
        return httpx.Response(200, json={"data": {"result": {"result": states}}})
    return httpx.Response(404)


class Made:
    def __init__(self) -> None:
        self.backends = 0
        self.clients: list[httpx.Client] = []


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[Made]:
    """Count the Ray backends the API builds and the HTTP clients they open (to the scripted dashboard)."""
    made = Made()

    class CountedBackend(api.dispatcher.ray_jobs.RayJobsBackend):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.backends += 1
            super().__init__(*args, **kwargs)

    class CountedClient(httpx.Client):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transport=httpx.MockTransport(dashboard), **kwargs)
            made.clients.append(self)

    monkeypatch.setattr(api.clusters.service, "RayJobsBackend", CountedBackend)
    monkeypatch.setattr(api.dispatcher.ray_jobs.httpx, "Client", CountedClient)
    yield made


def test_many_cluster_reads_use_one_client_closed_at_shutdown(
    settings: Settings, auth: dict[str, str], made: Made
) -> None:
    app = create_app(settings.model_copy(update={"ray_address": "http://ray-head:8265"}))
    with TestClient(app) as http:
        assert made.backends == 0  # made on first use, not at start-up
        for _ in range(REQUESTS):
            info = http.get("/v1/cluster", headers=auth).json()
            assert info["reachable"] is True and len(info["nodes"]) == 2
            assert info["total"]["CPU"] == 8 and info["free"]["CPU"] == 7
        assert made.backends == 1
        assert len(made.clients) == 1
        assert not made.clients[0].is_closed
    assert made.clients[0].is_closed  # the app's shutdown closed it


def test_concurrent_cluster_reads_share_one_client(settings: Settings, auth: dict[str, str], made: Made) -> None:
    app = create_app(settings.model_copy(update={"ray_address": "http://ray-head:8265"}))
    with TestClient(app) as http, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: http.get("/v1/cluster", headers=auth).json(), range(REQUESTS)))
    assert all(answer["reachable"] for answer in answers)
    assert made.backends == 1 and len(made.clients) == 1
    assert made.clients[0].is_closed


def test_each_cluster_is_read_at_its_own_address_with_its_own_token(
    settings: Settings, auth: dict[str, str], made: Made, database_url: str, tmp_path: Any
) -> None:
    token_file = tmp_path / "other-token"  # in the secrets folder: a record may name no other file
    token_file.write_text(OTHER_TOKEN + "\n")
    root = bearer(admin.token(database_url, "default", scope=Scope.admin))
    app = create_app(settings.model_copy(update={"ray_address": "http://ray-head:8265", "secrets_path": str(tmp_path)}))
    with TestClient(app) as http:
        body = {"name": "other", "address": "http://other-head:8265", "token_file": str(token_file)}
        assert http.post("/v1/clusters", json=body, headers=root).status_code == 201
        other = http.get("/v1/cluster", params={"name": "other"}, headers=root).json()
        assert (other["name"], other["reachable"], other["total"]["CPU"]) == ("other", True, 16)
        own = http.get("/v1/cluster", headers=auth).json()
        assert (own["name"], own["total"]["CPU"]) == ("default", 8)
        # A project token sees its own cluster only; a name that is no cluster is 404 for anyone.
        assert http.get("/v1/cluster", params={"name": "other"}, headers=auth).status_code == 404
        assert http.get("/v1/cluster", params={"name": "nowhere"}, headers=root).status_code == 404
        assert made.backends == 2  # one per cluster
        # A cluster whose token cannot be read is unreachable, never read with another cluster's token.
        token_file.unlink()
        body = {"name": "tokenless", "address": "http://other-head:8265", "token_file": str(token_file)}
        assert http.post("/v1/clusters", json=body, headers=root).status_code == 201
        tokenless = http.get("/v1/cluster", params={"name": "tokenless"}, headers=root).json()
        assert tokenless["reachable"] is False and "401" in tokenless["error"]
