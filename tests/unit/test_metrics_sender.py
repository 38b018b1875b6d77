"""trainmaster.log's sender against a scripted transport: outages, retries, overflow, flush."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

import trainmaster
from trainmaster.metrics import MetricsSender


class ScriptedApi:
    """Answers 503 while `down` is set; remembers every stored batch id."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.batches: dict[str, list[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.lost_answers = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/events"):
            self.events.append(body)
            return httpx.Response(201, json={})
        if self.down.is_set():
            return httpx.Response(503, json={"error": "DatabaseUnavailable"})
        duplicate = body["batch_id"] in self.batches
        self.batches[body["batch_id"]] = body["points"]
        if self.lost_answers:  # stored, but the answer never reaches the sender
            self.lost_answers -= 1
            raise httpx.ReadError("connection reset")
        return httpx.Response(201, json={"stored": 0 if duplicate else len(body["points"]), "duplicate": duplicate})

    def steps(self) -> list[int]:
        return sorted(p["step"] for points in self.batches.values() for p in points)


def sender(api: ScriptedApi, **kwargs: Any) -> MetricsSender:
    return MetricsSender("http://api", "tm_job", "job-1", 1, 0, transport=httpx.MockTransport(api), **kwargs)


def test_every_point_arrives_once_in_batches() -> None:
    api = ScriptedApi()
    s = sender(api)
    for step in range(2500):
        s.log({"loss": 1.0}, step)
    assert s.flush(10)
    assert api.steps() == list(range(2500))
    assert max(len(points) for points in api.batches.values()) <= 1000
    s.close()


def test_outage_is_retried_and_lost_answers_store_nothing_twice() -> None:
    api = ScriptedApi()
    api.down.set()
    s = sender(api)
    for step in range(300):
        s.log({"loss": 1.0}, step)
    assert not s.flush(0.5)  # the API is down: nothing can be sent yet, and log() did not block
    api.lost_answers = 1
    api.down.clear()
    assert s.flush(15)
    assert api.steps() == list(range(300))  # the batch whose answer was lost was resent with its id
    s.close()


def test_overflow_drops_and_reports_the_count() -> None:
    api = ScriptedApi()
    api.down.set()
    s = sender(api, buffer_points=100)
    for step in range(250):
        s.log({"loss": 1.0}, step)
    api.down.clear()
    assert s.flush(15)
    # The buffer holds 100; at most one more batch of 100 was already taken out when the outage began.
    assert 50 <= s.dropped <= 150
    assert len(api.steps()) + s.dropped == 250
    assert api.events and api.events[-1]["kind"] == "metrics_dropped"
    assert api.events[-1]["data"]["dropped"] == s.dropped
    s.close()


def test_log_outside_a_job_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINMASTER_JOB_ID", "TRAINMASTER_API_URL", "TRAINMASTER_JOB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    trainmaster.log({"loss": 1.0}, step=1)
    assert trainmaster.flush(1)
