"""Case 9: bodies over the limit, lying Content-Length, JSON nested 10,000 deep, against a real
server: each gets a fast 4xx, and /healthz keeps answering meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlparse

import httpx

from tests.e2e.conftest import ApiProcess
from tests.factories.http import bearer

HEALTH_BUDGET_S = 1.0


def raw_request(url: str, head: bytes, body: bytes = b"", *, read_timeout: float = 10.0) -> bytes:
    """Send bytes as they are (no client fixes the headers up); return what the server answers."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=read_timeout) as sock:
        sock.sendall(head + body)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0


def headers(api: ApiProcess, length: int, content_type: str = "application/json") -> bytes:
    host = urlparse(api.url).netloc
    return (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {api.token}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


class HealthProbe(threading.Thread):
    """Polls /healthz during the attacks and keeps the slowest answer."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.slowest, self.failures = url, threading.Event(), 0.0, 0

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(f"{self.url}/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.failures += 0 if ok else 1
                self.stop.wait(0.05)


def test_hostile_bodies_are_refused_fast_while_health_answers(strict_api: ApiProcess) -> None:
    probe = HealthProbe(strict_api.url)
    probe.start()
    try:
        # Declared over the limit: refused from the headers, before any body is read.
        answer = raw_request(strict_api.url, headers(strict_api, 50 * 1024 * 1024))
        assert status_of(answer) == 413

        # Declared small, then far more: only the declared bytes are a request; the rest is garbage.
        answer = raw_request(
            strict_api.url, headers(strict_api, 10), b'{"name": "x", "entrypoint": "builtin:mlp"}' * 1000
        )
        assert status_of(answer) in (400, 422)

        # Declared large (under the limit) but never sent: the server must not wait forever on it.
        slow = threading.Thread(
            target=raw_request,
            args=(strict_api.url, headers(strict_api, 900_000), b"{"),
            kwargs={"read_timeout": 3},
            daemon=True,
        )
        slow.start()

        # Chunked, with no length at all, past the limit.
        def chunks():  # type: ignore[no-untyped-def]
            for _ in range(40):
                yield b"x" * 65536

        response = httpx.post(
            f"{strict_api.url}/v1/jobs",
            content=chunks(),
            headers={**bearer(strict_api.token), "Content-Type": "application/json"},
            timeout=30,
        )
        assert response.status_code == 413

        # JSON nested 10,000 deep: a clear 4xx, not a crashed worker or a 500.
        deep = "[" * 10_000 + "]" * 10_000
        started = time.perf_counter()
        response = httpx.post(
            f"{strict_api.url}/v1/jobs",
            content=deep.encode(),
            headers={**bearer(strict_api.token), "Content-Type": "application/json"},
            timeout=30,
        )
        assert response.status_code in (400, 422), response.text[:300]
        deep_object = '{"config": ' * 10_000 + "{}" + "}" * 10_000
        response = httpx.post(
            f"{strict_api.url}/v1/jobs",
            content=deep_object.encode(),
            headers={**bearer(strict_api.token), "Content-Type": "application/json"},
            timeout=30,
        )
        assert response.status_code in (400, 422), response.text[:300]
        assert time.perf_counter() - started < 10
        slow.join(10)
    finally:
        probe.stop.set()
        probe.join(10)
    assert probe.failures == 0
    assert probe.slowest < HEALTH_BUDGET_S, f"/healthz took {probe.slowest:.2f} s under attack"
    assert httpx.get(f"{strict_api.url}/readyz", timeout=5).status_code == 200
