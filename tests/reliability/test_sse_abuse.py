"""Case 11: more streams than the per-token cap get 429; a client that never reads is dropped; the
server's memory stays flat over 1,000 connect/disconnect cycles. Against a real API process with a
cap of 2 streams per token and a 2 s send timeout."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import httpx
import psutil

from tests.e2e.conftest import ApiProcess
from tests.factories.auth import project_token
from tests.factories.http import bearer
from tests.factories.jobs import spec
from tests.factories.waiting import wait_until


def new_job(api: ApiProcess, token: str) -> str:
    return str(httpx.post(f"{api.url}/v1/jobs", json=spec(), headers=bearer(token), timeout=30).json()["id"])


def stream_status(api: ApiProcess, token: str, job_id: str) -> int:
    with httpx.stream("GET", f"{api.url}/v1/jobs/{job_id}/metrics/stream", headers=bearer(token), timeout=10) as r:
        return r.status_code


def test_streams_past_the_cap_are_429(strict_api: ApiProcess, database_url: str) -> None:
    token = project_token(database_url, "cap")
    job_id = new_job(strict_api, token)
    url = f"{strict_api.url}/v1/jobs/{job_id}/metrics/stream"
    with (
        httpx.Client(timeout=10) as a,
        httpx.Client(timeout=10) as b,
        a.stream("GET", url, headers=bearer(token)) as first,
        b.stream("GET", url, headers=bearer(token)) as second,
    ):
        assert first.status_code == second.status_code == 200
        third = httpx.get(f"{strict_api.url}/v1/jobs/{job_id}/logs/stream", headers=bearer(token), timeout=10)
        assert third.status_code == 429 and third.headers.get("retry-after")
        other = project_token(database_url, "cap-other")  # the cap is per token, not global
        assert stream_status(strict_api, other, new_job(strict_api, other)) == 200
    wait_until(lambda: stream_status(strict_api, token, job_id) == 200, 10, what="closed streams to be released")


def test_a_reader_that_never_reads_is_dropped(strict_api: ApiProcess, database_url: str) -> None:
    token = project_token(database_url, "sloth")
    job_id = new_job(strict_api, token)
    parsed = urlparse(strict_api.url)
    sockets = []
    for _ in range(2):  # fill the cap with readers that never read
        sock = socket.create_connection((parsed.hostname, parsed.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            f"GET /v1/jobs/{job_id}/metrics/stream HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        sockets.append(sock)
    wait_until(lambda: stream_status(strict_api, token, job_id) == 429, 10, what="the sloths to hold the cap")
    big = "x" * 200
    for batch in range(40):  # about 8 MB of events they will never take
        points = [{"step": batch * 500 + i, "values": {f"metric_{big}": float(i)}} for i in range(500)]
        assert (
            httpx.post(
                f"{strict_api.url}/v1/jobs/{job_id}/metrics", json={"points": points}, headers=bearer(token), timeout=30
            ).status_code
            == 201
        )
    try:
        wait_until(
            lambda: stream_status(strict_api, token, job_id) == 200,
            60,
            interval=0.5,
            what="the server to drop the readers that stopped reading",
        )
    finally:
        for sock in sockets:
            sock.close()


def test_memory_stays_flat_over_many_connect_disconnect_cycles(strict_api: ApiProcess, database_url: str) -> None:
    token = project_token(database_url, "cycles")
    job_id = new_job(strict_api, token)
    api = psutil.Process(strict_api.process.pid)  # with its uvicorn workers, which serve the streams

    def rss() -> int:
        return sum(p.memory_info().rss for p in [api, *api.children(recursive=True)])

    url = f"{strict_api.url}/v1/jobs/{job_id}/metrics/stream"

    def cycles(count: int) -> None:
        with httpx.Client(timeout=10) as client:
            for _ in range(count):
                with client.stream("GET", url, headers=bearer(token)) as response:
                    assert response.status_code == 200
                    next(response.iter_lines())  # the first event arrives, then the client leaves

    cycles(100)  # warm-up: allocator pools, caches, the LISTEN connection
    before = rss()
    cycles(1000)
    grown = rss() - before
    assert grown < 20 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 1,000 streams"
    wait_until(lambda: stream_status(strict_api, token, job_id) == 200, 10, what="every stream to be released")
