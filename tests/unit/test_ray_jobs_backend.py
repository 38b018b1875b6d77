"""The dispatcher's cluster reads reuse one HTTP client: a new client per request built a TLS context
each time (about 20 ms of CPU, twice a round), most of an idle dispatcher's CPU."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.dispatcher import ray_jobs
from api.dispatcher.ray_jobs import RayJobsBackend

NODE = "a" * 56
STATUS = {
    "data": {
        "clusterStatus": {"loadMetricsReport": {"usageByNode": {NODE: {"CPU": [1.0, 4.0], "tmNode1": [0.0, 1.0]}}}}
    }
}
NODES = {
    "data": {
        "result": {
            "result": [
                {
                    "node_id": NODE,
                    "state": "ALIVE",
                    "node_ip": "10.0.0.2",
                    "resources_total": {"CPU": 4, "tm_node_1": 1},
                }
            ]
        }
    }
}


def test_cluster_reads_share_one_client_and_keep_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=STATUS if request.url.path == "/api/cluster_status" else NODES)

    built: list[httpx.Client] = []
    real = httpx.Client

    def client(*args: Any, **kwargs: Any) -> httpx.Client:
        built.append(real(*args, transport=httpx.MockTransport(answer), **kwargs))
        return built[-1]

    monkeypatch.setattr(ray_jobs.httpx, "Client", client)
    backend = RayJobsBackend("http://ray-head:8265", token="secret")
    for _ in range(3):
        (node,) = backend.cluster().nodes
    assert node.total == {"CPU": 4.0, "tm_node_1": 1.0} and node.free == {"CPU": 3.0, "tm_node_1": 1.0}
    assert len(built) == 1
    assert len(seen) == 6 and all(r.headers["authorization"] == "Bearer secret" for r in seen)
    assert seen[1].url.params["detail"] == "1"
