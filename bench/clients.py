"""Load from separate client processes, each running blocking clients on threads: what a user's
programs look like to the API, and a load generator that does not itself become the bottleneck.

Why not asyncio clients in the measuring process (what api_load.py did first): one event loop running
eight httpx.AsyncClient requests spends more CPU per request than the API's handler (httpcore's async
pool, anyio, h11 in pure Python), all on one core's worth of GIL, and on a 2-core machine it took that
core from the API and PostgreSQL. The first api_load.py also mixed POST and GET 50/50 on one set of
clients, so each path's rate was half the clients' and the slower path set the pace of both. The
figures it reported were its own ceiling, about a fifth of what plain threads posting reach.

Here `--client-procs` processes run the clients (threads, one keep-alive `http.client` connection
each, bodies encoded beforehand), every request is timed on its own, and each path is its own phase.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Phase:
    """What every client of one phase sends: `requests` (method, path, body) in a random order, from
    `start` (time.time()) for `duration` seconds after `warmup` unmeasured ones; or, with `count`, each
    request once (split between the clients), all of them measured."""

    base_url: str
    headers: dict[str, str]
    requests: list[tuple[str, str, bytes | None]]
    expect: int
    warmup: float = 0.0
    duration: float = 0.0
    once: bool = False
    keep_ids: bool = False  # return the "id" of each answer (POST /v1/jobs)
    ray_token: str | None = None  # for the Ray Jobs peer: submit_job instead of HTTP requests


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu_s: float = 0.0  # CPU time of the client processes (all their threads)
    sent: int = 0  # requests answered, warm-up included

    def merge(self, other: Outcome) -> None:
        self.latencies += other.latencies
        self.errors.update(other.errors)
        self.ids += other.ids
        self.seconds = max(self.seconds, other.seconds)
        self.client_cpu_s += other.client_cpu_s
        self.sent += other.sent


def _http_client(phase: Phase) -> Callable[[tuple[str, str, bytes | None]], tuple[int, bytes]]:
    parts = urlsplit(phase.base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    headers = {**phase.headers, "Content-Type": "application/json"}

    def send(request: tuple[str, str, bytes | None]) -> tuple[int, bytes]:
        method, path, body = request
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()

    return send


def _ray_client(phase: Phase) -> Callable[[tuple[str, str, bytes | None]], tuple[int, bytes]]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(phase.base_url, headers={"Authorization": f"Bearer {phase.ray_token}"})

    def send(request: tuple[str, str, bytes | None]) -> tuple[int, bytes]:
        return 200, client.submit_job(entrypoint=request[1]).encode()

    return send


def _client(phase: Phase, todo: list[tuple[str, str, bytes | None]], begin: float, seed: int) -> Outcome:
    outcome = Outcome()
    send = _ray_client(phase) if phase.ray_token else _http_client(phase)
    rng = random.Random(seed)
    measure_from = begin + phase.warmup
    end = measure_from + phase.duration
    time.sleep(max(0.0, begin - time.time()))
    for n in range(len(todo) if phase.once else 1 << 62):
        started = time.time()
        if not phase.once and started >= end:
            break
        request = todo[n] if phase.once else rng.choice(todo)
        try:
            status, body = send(request)
        except Exception as exc:  # a failed request is counted, never fatal to the run
            outcome.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            send = _ray_client(phase) if phase.ray_token else _http_client(phase)
            continue
        took = time.time() - started
        outcome.sent += 1
        if status != phase.expect:
            outcome.errors[f"HTTP {status}: {body[:80]!r}"] += 1
        elif phase.once or started >= measure_from:
            outcome.latencies.append(took)
            if phase.keep_ids:
                outcome.ids.append(json.loads(body)["id"])
    outcome.seconds = (time.time() - measure_from) if phase.once else phase.duration
    return outcome


def _process(phase: Phase, threads: int, index: int, procs: int, begin: float) -> Outcome:
    """One client process: `threads` clients; with `once`, this process's share of the requests."""
    results: list[Outcome] = []
    cpu_began = time.process_time()
    mine = phase.requests[index::procs] if phase.once else phase.requests

    def run(t: int) -> None:
        results.append(_client(phase, mine[t::threads] if phase.once else mine, begin, index * 1000 + t))

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = Outcome()
    for result in results:
        total.merge(result)
    total.client_cpu_s = time.process_time() - cpu_began
    return total


def drive(phase: Phase, clients: int, procs: int) -> Outcome:
    """`clients` clients spread over `procs` processes, all starting together; their merged outcome."""
    procs = max(1, min(procs, clients))
    per_proc = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    begin = time.time() + 2.0 + 0.5 * procs  # room for the processes to start
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        pending = [pool.apply_async(_process, (phase, n, i, procs, begin)) for i, n in enumerate(per_proc)]
        total = Outcome()
        for result in pending:
            total.merge(result.get(timeout=phase.warmup + phase.duration + 600))
    if phase.once:
        total.seconds = max(total.seconds, 1e-9)
    return total


def summary(path: str, outcome: Outcome, **extra: Any) -> dict[str, Any]:
    from common import ms

    return {
        "path": path,
        **extra,
        "requests": len(outcome.latencies),
        "errors": sum(outcome.errors.values()),
        "req_per_s": len(outcome.latencies) / outcome.seconds if outcome.seconds else 0.0,
        **ms(outcome.latencies, 50, 99),
        "client_cpu_ms_per_req": 1000 * outcome.client_cpu_s / max(1, outcome.sent),
    }
