"""A real HTTP server on loopback in front of the app in process, that fails on cue.

Until `start()` its port refuses connections. Each request takes the next step of `plan`: a `Fault`
is answered by the proxy itself (503 with Retry-After, 429, 401, …); a `Cut` passes the request
through but breaks the answer off in the middle of an event stream, without ending its chunked body,
so the client sees the connection drop; once the plan is spent, requests pass through.
"""

from __future__ import annotations

import collections
import http.server
import json
import threading
import time
from dataclasses import dataclass

import httpx

from trainmaster.ports import free_port

FORWARDED = ("authorization", "accept", "content-type", "idempotency-key", "last-event-id")
RETURNED = ("content-type", "retry-after", "www-authenticate")


@dataclass(frozen=True)
class Fault:
    status: int
    error: str = "DatabaseUnavailable"
    retry_after: str | None = None


@dataclass(frozen=True)
class Cut:
    """Deliver this many whole events of the answer and a few bytes of the next, then drop the connection."""

    events: int


class FaultyProxy:
    def __init__(self, transport: httpx.BaseTransport):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.plan: collections.deque[Fault | Cut] = collections.deque()
        self.answered: list[tuple[float, str, int]] = []  # (monotonic time, path, status) of every request
        self.last_event_ids: list[str | None] = []  # the Last-Event-ID header of every request
        self.upstream = httpx.Client(base_url="http://testserver", transport=transport)
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.handle(self)

            def do_POST(self) -> None:
                proxy.handle(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.upstream.close()

    def statuses(self) -> list[int]:
        return [status for _, _, status in self.answered]

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        self.last_event_ids.append(request.headers.get("Last-Event-ID"))
        step = self.plan.popleft() if self.plan else None
        if isinstance(step, Fault):
            payload = json.dumps({"error": step.error, "detail": "injected by the test's proxy"}).encode()
            headers = {"Content-Type": "application/json"}
            if step.retry_after is not None:
                headers["Retry-After"] = step.retry_after
            self._answer(request, step.status, headers, payload)
            return
        upstream = self.upstream.request(
            request.command,
            request.path,
            content=body,
            headers={k: v for k, v in request.headers.items() if k.lower() in FORWARDED},
        )
        headers = {k: v for k, v in upstream.headers.items() if k.lower() in RETURNED}
        if isinstance(step, Cut):
            self._answer_cut(request, upstream.status_code, headers, upstream.content, step.events)
        else:
            self._answer(request, upstream.status_code, headers, upstream.content)

    def _answer(
        self, request: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], payload: bytes
    ) -> None:
        self.answered.append((time.monotonic(), request.path, status))
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    def _answer_cut(
        self,
        request: http.server.BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        payload: bytes,
        events: int,
    ) -> None:
        self.answered.append((time.monotonic(), request.path, status))
        end = 0
        for _ in range(events):
            end = payload.index(b"\n\n", end) + 2
        part = payload[: end + 20]  # and the start of the next event, never finished
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        request.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        request.wfile.flush()
        request.close_connection = True  # closed without the last chunk: an incomplete body
