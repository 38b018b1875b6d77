"""trainmaster.log's sender against a scripted transport: outages, retries, overflow, flush."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import trainmaster
from tests.factories.waiting import wait_until
from trainmaster import metrics
from trainmaster.context import JobApi, MetricsPoster
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
    return MetricsSender(JobApi("http://api", "tm_job", "job-1", 1, transport=httpx.MockTransport(api)), 0, **kwargs)


def test_every_point_arrives_once_in_batches() -> None:
    api = ScriptedApi()
    s = sender(api)
    for step in range(2500):
        s.log({"loss": 1.0}, step)
    assert s.flush(10)
    assert api.steps() == list(range(2500))
    assert max(len(points) for points in api.batches.values()) <= 1000
    s.close()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice is Linux's")
def test_the_sender_thread_yields_the_cpu_to_training_and_the_training_thread_keeps_its_priority() -> None:
    api = ScriptedApi()
    s = sender(api)
    s.log({"loss": 1.0}, 0)
    assert s.flush(10)
    assert s.thread.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, s.thread.native_id) == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19  # the caller, training, untouched
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


class RecordingApi(http.server.ThreadingHTTPServer):
    """A real HTTP server on loopback that stores every metrics batch it is sent."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.tokens.add(self.headers["Authorization"])
                if self.path.endswith("/metrics"):
                    server.batches.append({"path": self.path, **body})
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def fresh_sender(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """trainmaster.log's process-wide sender, reset before and after the test."""
    monkeypatch.setattr(metrics, "_sender", None)
    monkeypatch.setattr(metrics, "_sender_pid", None)
    yield
    if metrics._sender is not None:
        metrics._sender.close(1)


def test_log_inside_a_job_reaches_the_api_with_the_job_token(
    monkeypatch: pytest.MonkeyPatch, fresh_sender: None
) -> None:
    api = RecordingApi()
    try:
        monkeypatch.setenv("TRAINMASTER_JOB_ID", "job-7")
        monkeypatch.setenv("TRAINMASTER_ATTEMPT", "2")
        monkeypatch.setenv("TRAINMASTER_API_URL", api.url)
        monkeypatch.setenv("TRAINMASTER_JOB_TOKEN", "tm_job_secret")
        monkeypatch.setenv("RANK", "3")
        for step in range(5):
            trainmaster.log({"loss": 1.0 / (step + 1)}, step=step)
        assert trainmaster.flush(10)
        points = [p for batch in api.batches for p in batch["points"]]
        assert [p["step"] for p in points] == [0, 1, 2, 3, 4]
        assert {p["rank"] for p in points} == {3}
        assert {b["path"] for b in api.batches} == {"/v1/jobs/job-7/metrics"}
        assert {b["attempt"] for b in api.batches} == {2}
        assert api.tokens == {"Bearer tm_job_secret"}
    finally:
        api.shutdown()


def test_log_outside_a_job_sends_nothing_and_starts_no_thread(
    monkeypatch: pytest.MonkeyPatch, fresh_sender: None
) -> None:
    for name in ("TRAINMASTER_JOB_ID", "TRAINMASTER_API_URL", "TRAINMASTER_JOB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    sent: list[httpx.Request] = []
    monkeypatch.setattr(httpx.Client, "send", lambda self, request, **_: sent.append(request))
    trainmaster.log({"loss": 1.0}, step=1)
    assert metrics._sender is None
    assert not [t for t in threading.enumerate() if t.name == "trainmaster-metrics" and t.is_alive()]
    assert trainmaster.flush(1)  # nothing logged, so nothing is left to send
    assert sent == []


def test_an_idle_sender_sends_a_point_at_once_not_at_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "FLUSH_INTERVAL_S", 3600.0)  # only "send at once" can deliver it in time
    api = ScriptedApi()
    s = sender(api)
    try:
        s.log({"loss": 1.0}, 0)
        wait_until(lambda: api.steps() == [0], 10, interval=0.005, what="step 0 sent")
        s.log({"loss": 0.5}, 1)  # idle again: this one goes at once too
        wait_until(lambda: api.steps() == [0, 1], 10, interval=0.005, what="step 1 sent")
    finally:
        s.close()


def test_under_load_points_go_in_batches_one_request_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "MIN_INTERVAL_S", 0.5)
    api = ScriptedApi()
    s = sender(api)
    try:
        for step in range(200):  # a fast loop: far more steps than intervals
            s.log({"loss": 1.0}, step)
        assert s.flush(10)
        assert api.steps() == list(range(200))
        assert len(api.batches) <= 3  # the first point at once, the rest together
    finally:
        s.close()


def test_poster_keeps_its_connection_reopens_a_closed_one_and_raises_when_no_one_answers() -> None:
    """MetricsPoster, the sender's own connection, against a real HTTP server: one connection for
    consecutive batches, a new one after the server closed it, and an error the sender retries on
    when nothing listens."""
    seen: list[tuple[int, bytes, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.client_address[1], body, self.headers.get("Authorization")))
            self.send_response(201 if len(seen) != 3 else 503)
            self.send_header("Content-Length", "0")
            if len(seen) == 2:
                self.send_header("Connection", "close")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    poster = MetricsPoster(f"http://127.0.0.1:{server.server_address[1]}/v1/jobs/j/metrics", "tm_job")
    try:
        assert [poster.post(b'{"points":[%d]}' % n)[0] for n in range(4)] == [201, 201, 503, 201]
    finally:
        server.shutdown()
        server.server_close()
    ports = [port for port, _, _ in seen]
    assert ports[0] == ports[1] and ports[2] != ports[1] and ports[3] == ports[2]
    assert [body for _, body, _ in seen] == [b'{"points":[%d]}' % n for n in range(4)]
    assert {auth for _, _, auth in seen} == {"Bearer tm_job"}
    poster.close()
    with pytest.raises(OSError):
        poster.post(b"{}")


class RefusingApi(ScriptedApi):
    """Refuses batches as the real API does (trainmaster.models, api/metrics/batch.py): a negative step
    is a 422 naming the point; `too_large` answers 413 for the whole batch instead."""

    def __init__(self) -> None:
        super().__init__()
        self.too_large = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/metrics"):
            if self.too_large:
                return httpx.Response(413, json={"error": "PayloadTooLarge", "detail": "over the limit"})
            bad = [i for i, point in enumerate(body["points"]) if point["step"] is not None and point["step"] < 0]
            if bad:
                detail = [{"loc": ["body", "points", i, "step"], "msg": "Input should be >= 0"} for i in bad]
                return httpx.Response(422, json={"error": "ValidationError", "detail": detail})
        return super().__call__(request)


def test_a_refused_point_is_dropped_the_rest_sent_and_the_count_reported() -> None:
    api = RefusingApi()
    s = sender(api)
    for step in (0, 1, -1, 2, -2, 3):
        s.log({"loss": 1.0}, step)
    assert s.flush(10)
    s.close()
    assert api.steps() == [0, 1, 2, 3]
    assert s.rejected == 2 and s.dropped == 0
    event = api.events[-1]
    assert event["kind"] == "metrics_dropped" and event["data"]["rejected"] == 2
    assert any("points[" in reason and "step" in reason for reason in event["data"]["reasons"])


def test_a_batch_refused_as_a_whole_is_counted_not_lost_silently() -> None:
    api = RefusingApi()
    api.too_large = True
    s = sender(api)
    for step in range(5):
        s.log({"loss": 1.0}, step)
    assert s.flush(10)
    s.close()
    assert api.steps() == [] and s.rejected == 5
    assert api.events[-1]["data"]["rejected"] == 5 and "413" in api.events[-1]["data"]["reasons"][0]


def test_rank_zero_says_the_world_size_with_its_first_point_only() -> None:
    """A chart shows throughput per worker count: each worker group's rank 0 (a resized elastic gang
    starts new processes) puts `sys/world_size` into its first point; the user's values are kept."""
    api = ScriptedApi()
    zero = MetricsSender(
        JobApi("http://api", "tm_job", "job-1", 1, transport=httpx.MockTransport(api)), 0, world_size=4
    )
    one = MetricsSender(JobApi("http://api", "tm_job", "job-1", 1, transport=httpx.MockTransport(api)), 1, world_size=4)
    for step in (1, 2):
        zero.log({"loss": 1.0}, step)
        one.log({"loss": 2.0}, step)
    assert zero.flush() and one.flush()
    points = sorted((p["rank"], p["step"], p["values"]) for batch in api.batches.values() for p in batch)
    assert points == [
        (0, 1, {"sys/world_size": 4.0, "loss": 1.0}),
        (0, 2, {"loss": 1.0}),
        (1, 1, {"loss": 2.0}),
        (1, 2, {"loss": 2.0}),
    ]
    zero.close()
    one.close()
