"""Load from separate client processes, each running blocking clients on threads: what a user's
programs look like to the API, and a load generator that does not itself become the bottleneck.

Not asyncio clients in the measuring process: an event loop of httpx requests spends more CPU per
request than the API's handler, on one core's worth of GIL, and on a small machine takes that core from
the API and PostgreSQL. Here the clients are threads in `procs` processes, one keep-alive `http.client`
connection each, bodies encoded beforehand; every request is timed on its own, and each path is its own
phase.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

Request = tuple[str, str, bytes | None]  # method, path, body
Send = Callable[[Request], tuple[int, bytes]]


@dataclass(frozen=True)
class Phase:
    """What every client of one phase sends: `requests` in a random order, from a common start for
    `duration` seconds after `warmup` unmeasured ones; or, with `once`, each request once (split between
    the clients), all of them measured."""

    base_url: str
    headers: dict[str, str]
    requests: Sequence[Request]
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

    def __add__(self, other: Outcome) -> Outcome:
        return Outcome(
            *(self.latencies + other.latencies, self.errors + other.errors, self.ids + other.ids),
            *(max(self.seconds, other.seconds), self.client_cpu_s + other.client_cpu_s, self.sent + other.sent),
        )


def connect(phase: Phase) -> Send:
    """A sender over one keep-alive connection (or one Ray JobSubmissionClient for the peer)."""
    if phase.ray_token:
        from ray.job_submission import JobSubmissionClient

        ray = JobSubmissionClient(phase.base_url, headers={"Authorization": f"Bearer {phase.ray_token}"})
        return lambda request: (200, ray.submit_job(entrypoint=request[1]).encode())
    parts, headers = urlsplit(phase.base_url), {**phase.headers, "Content-Type": "application/json"}
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)

    def send(request: Request) -> tuple[int, bytes]:
        conn.request(request[0], request[1], body=request[2], headers=headers)
        response = conn.getresponse()
        return response.status, response.read()

    return send


def client(phase: Phase, todo: Sequence[Request], begin: float, seed: int) -> Outcome:
    outcome, send, rng = Outcome(), connect(phase), random.Random(seed)
    measure_from = begin + phase.warmup
    end = measure_from + phase.duration
    time.sleep(max(0.0, begin - time.time()))
    for n in range(len(todo) if phase.once else 1 << 62):
        started = time.time()
        if not phase.once and started >= end:
            break
        try:
            status, body = send(todo[n] if phase.once else rng.choice(todo))
        except Exception as exc:  # a failed request is counted, never fatal to the run
            outcome.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            send = connect(phase)
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


def process(phase: Phase, threads: int, index: int, procs: int, begin: float) -> Outcome:
    """One client process: `threads` clients; with `once`, this process's share of the requests."""
    cpu_began = time.process_time()
    mine = phase.requests[index::procs] if phase.once else phase.requests
    with ThreadPoolExecutor(threads) as pool:
        todo = [mine[t::threads] if phase.once else mine for t in range(threads)]
        outcomes = list(pool.map(client, [phase] * threads, todo, [begin] * threads, range(index * 1000, 1 << 30)))
    return sum(outcomes, Outcome(client_cpu_s=time.process_time() - cpu_began))


def drive(phase: Phase, clients: int, procs: int) -> Outcome:
    """`clients` clients spread over `procs` processes, all starting together; their merged outcome."""
    procs = max(1, min(procs, clients))
    begin = time.time() + 2.0 + 0.5 * procs  # room for the processes to start
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        shares = [(phase, clients // procs + (i < clients % procs), i, procs, begin) for i in range(procs)]
        pending = [pool.apply_async(process, share) for share in shares]
        total = sum((result.get(timeout=phase.warmup + phase.duration + 600) for result in pending), Outcome())
    if phase.once:
        total.seconds = max(total.seconds, 1e-9)
    return total
