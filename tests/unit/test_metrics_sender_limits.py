"""trainmaster.log's sender when the API refuses batches for a write limit (429): it drops them, says so
once, waits longer after each refusal, and goes on sending (training never waits or fails)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from trainmaster import metrics
from trainmaster.context import JobApi
from trainmaster.metrics import MetricsSender

DETAIL = "metric points per job per second: 10 (TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S); retry after 1.0 s"


class LimitingApi:
    """Refuses the first `refusals` metric batches with the API's 429, then stores them."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.lock = threading.Lock()
        self.asked: list[float] = []  # when each metrics request came
        self.sent: list[list[int]] = []  # each request's steps
        self.stored: list[int] = []
        self.events: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/events"):
            self.events.append(body)
            return httpx.Response(201, json={})
        with self.lock:
            self.asked.append(time.monotonic())
            self.sent.append([point["step"] for point in body["points"]])
            if len(self.asked) <= self.refusals:
                refusal = {"error": "LimitExceeded", "detail": DETAIL}
                return httpx.Response(429, json=refusal, headers={"Retry-After": "1"})
            self.stored += [point["step"] for point in body["points"]]
        return httpx.Response(201, json={"stored": len(body["points"]), "duplicate": False})


def test_batches_refused_for_a_limit_are_dropped_once_said_and_backed_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(metrics, "LIMITED_BACKOFF_S", 0.3)
    api = LimitingApi(refusals=2)
    s = MetricsSender(JobApi("http://api", "tm_job", "job-1", 1, transport=httpx.MockTransport(api)), 0)
    started = time.monotonic()
    for step in range(3000):
        s.log({"loss": 1.0}, step)
    assert time.monotonic() - started < 1.0  # logging never waited on the refusals
    assert s.flush(15)
    s.close()

    steps = [step for sent in api.sent for step in sent]
    assert sorted(steps) == list(range(3000))  # every point sent once: a refused batch is not sent again
    refused = len(api.sent[0]) + len(api.sent[1])
    assert s.rejected == refused and sorted(api.stored) == list(range(refused, 3000))
    waits = [later - earlier for earlier, later in zip(api.asked, api.asked[1:], strict=False)]
    assert waits[0] >= 0.3 and waits[1] >= 0.6  # held back after each refusal, longer the second time
    printed = capsys.readouterr().err
    assert printed.count("[trainmaster] metric points dropped") == 1  # the reason said once, naming the setting
    assert "TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S" in printed
    event = api.events[-1]
    assert event["kind"] == "metrics_dropped" and event["data"]["rejected"] == refused
    assert any("TRAINMASTER_METRIC_POINTS_PER_JOB_PER_S" in reason for reason in event["data"]["reasons"])
