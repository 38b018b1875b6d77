"""What `trainmaster.should_checkpoint()` tells the platform (trainmaster/control.py), against a local
HTTP server standing in for the API: the process says once that it reads the flag, and the first True
for a request is announced before it is returned (what the dispatcher's `answered_after` relies on)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

JOB = "00000000-0000-0000-0000-000000000001"

TRAINING = """
import time, httpx, trainmaster
deadline = time.monotonic() + 20
while not trainmaster.should_checkpoint():
    assert time.monotonic() < deadline, "never asked"
    time.sleep(0.05)
httpx.get(URL + "/asked")  # the training code now checkpoints: the server notes when
for _ in range(20):
    assert trainmaster.should_checkpoint()
"""


class Api:
    def __init__(self) -> None:
        self.seen: list[Any] = []  # ("control",) / ("event", kind, message, data) / ("asked",), in order
        self.polls = 0


@pytest.fixture
def api() -> Iterator[tuple[Api, str]]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path.endswith("/control"):
                state.polls += 1
                self.answer({"checkpoint": True, "reason": "preempted by h"} if state.polls >= 3 else {})
            else:
                state.seen.append(("asked",))
                self.answer({})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state.seen.append(("event", body["kind"], body["message"], body["data"]))
            self.answer({"id": len(state.seen)})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def test_the_first_true_is_announced_once_before_it_is_returned(api: tuple[Api, str]) -> None:
    state, url = api
    env = {
        "TRAINMASTER_JOB_ID": JOB,
        "TRAINMASTER_ATTEMPT": "2",
        "TRAINMASTER_API_URL": url,
        "TRAINMASTER_JOB_TOKEN": "t",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", f"URL = {url!r}\n{TRAINING}"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    events = [entry for entry in state.seen if entry[0] == "event"]
    assert [kind for _, kind, _, _ in events] == ["checkpoint_reader", "preempt_seen"]
    assert all(data == {"attempt": 2} for *_, data in events)
    assert events[1][2] == "the training code saw the request to checkpoint (preempted by h)"
    assert state.seen.index(("asked",)) > state.seen.index(events[1])  # announced before it was acted on
