"""Latency from `trainmaster.log()` to an SSE client receiving the point, against raw LISTEN/NOTIFY.

The API: `trainmaster api` on a scratch database with one queued job. This process reads
GET /v1/jobs/{id}/metrics/stream; once it answers, a second process logs `{"t_sent": time.time(), ...}`
through the SDK's `MetricsSender` (what `trainmaster.log` uses) at `--rate` points/s for `--warmup` +
`--duration` seconds. Latency is arrival time minus t_sent (one clock); warm-up points are checked for
loss but not timed. The peer: a second process sends `pg_notify(channel, '<i>:<time.time()>')` at the
same rate on the same server and this process LISTENs (the API's fan-out is a NOTIFY per batch, then a read).

    .venv/bin/python bench/sse_latency.py [--rate 50] [--duration 20] [--warmup 2]
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
from harness import api_process, ms, parse_args, run, scratch_database, submit_job

from trainmaster.context import JobApi
from trainmaster.metrics import MetricsSender
from trainmaster.sse import parse

CHANNEL, SENT = "tm_bench_latency", "t_sent"
Received = dict[int, list[tuple[float, float]]]  # step -> [(received at, t_sent)], more than one if duplicated
Starter = Callable[[], None]  # starts the producer, once the consumer listens


def paced(rate: float, points: int) -> Iterator[int]:
    """0..points-1, each at its slot on a fixed schedule."""
    start = time.monotonic()
    for i in range(points):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        yield i


def log_points(api_url: str, token: str, job_id: str, rate: float, points: int) -> tuple[int, int]:
    """The API's producer (a spawned process): points sent, points dropped."""
    sender = MetricsSender(JobApi(api_url, token, job_id, None), rank=0)
    for i in paced(rate, points):
        sender.log({SENT: time.time(), "loss": 1 / (i + 1)}, step=i)
    sender.close(timeout=30)
    return sender.sent_points, sender.dropped


def notify_points(database_url: str, rate: float, points: int) -> tuple[int, int]:
    """The peer's producer (a spawned process)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        for i in paced(rate, points):
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{i}:{time.time()!r}"))
    return points, 0


def consume_sse(api_url: str, token: str, job_id: str, points: int, budget_s: float, start: Starter) -> Received:
    received: Received = {}
    deadline, headers = time.monotonic() + budget_s, {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=api_url, headers=headers, timeout=httpx.Timeout(10, read=budget_s)) as http,
        http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream") as response,
    ):
        response.raise_for_status()
        lines = itertools.takewhile(lambda _: time.monotonic() < deadline, response.iter_lines())
        for n, event in enumerate(parse(lines)):
            now = time.time()
            for item in event.data["items"] if event.event == "metrics" else []:
                if item["name"] == SENT:
                    received.setdefault(item["step"], []).append((now, item["value"]))
            if n == 0:  # the first event (the job's status) says the stream is live
                start()
            if event.event == "end" or complete(received, points):
                break
    return received


def consume_notify(database_url: str, points: int, budget_s: float, start: Starter) -> Received:
    received: Received = {}
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        start()
        for notify in conn.notifies(timeout=budget_s):
            step, _, sent = notify.payload.partition(":")
            received.setdefault(int(step), []).append((time.time(), float(sent)))
            if complete(received, points):
                break
    return received


def complete(received: Received, points: int) -> bool:
    """Every point came, or the last one did (the stream is ordered: anything still missing is lost)."""
    return len(received) >= points or points - 1 in received


def measure(produce: Callable[..., tuple[int, int]], produce_args: tuple[Any, ...],
            consume: Callable[[Starter], Received], budget_s: float) -> tuple[Received, tuple[int, int]]:  # fmt: skip
    """The consumer; once it listens, it starts the producer in a spawned process. What each saw."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        started: list[Any] = []
        received = consume(lambda: started.append(pool.apply_async(produce, produce_args)))
        if not started:
            raise RuntimeError("the consumer never became ready")
        return received, started[0].get(timeout=budget_s)


def row(path: str, received: Received, points: int, skip: int) -> dict[str, Any]:
    latencies = [at - sent for step, hits in received.items() if step >= skip for at, sent in hits]
    lost, duplicated = len(set(range(points)) - set(received)), sum(len(hits) > 1 for hits in received.values())
    figures = {**ms(latencies, 50, 95, 99), "max_ms": max(latencies, default=float("nan")) * 1000}
    return {"path": path, "points": len(latencies), **figures, "lost": lost, "duplicated": duplicated}


def main() -> None:
    args = parse_args(
        __doc__,
        ("--rate", 50.0, "points logged per second"),
        ("--duration", 20.0, "measured seconds"),
        ("--warmup", 2.0, "unmeasured seconds first"),
        database=True,
    )
    skip, points = round(args.rate * args.warmup), round(args.rate * (args.warmup + args.duration))
    budget_s = 60 + points / args.rate
    with run("sse_latency", args) as record, scratch_database(record, args.database_url) as url:
        with api_process(url) as api:
            job_id = submit_job(api)
            print(f"API: {points} points at {args.rate:g}/s through MetricsSender to SSE", flush=True)
            consume = functools.partial(consume_sse, api.url, api.token, job_id, points, budget_s)
            received, (sent, dropped) = measure(log_points, (api.url, api.token, job_id, args.rate, points),
                                                consume, budget_s)  # fmt: skip
        print("peer: LISTEN/NOTIFY at the same rate", flush=True)
        consume = functools.partial(consume_notify, url, points, budget_s)
        peer_received, _ = measure(notify_points, (url, args.rate, points), consume, budget_s)
        ours, peer = record.tables["latency"] = [
            row("trainmaster.log -> SSE", received, points, skip),
            row("peer: LISTEN/NOTIFY", peer_received, points, skip),
        ]
        for pct in ("p50_ms", "p95_ms"):
            record.ratio(f"{ours['path']}, {pct.replace('_', ' ')}", ours[pct], peer["path"], peer[pct])
        record.ratio(f"{ours['path']}, p95 ms (goal <= 150)", ours["p95_ms"], "goal", 150.0)
        record.valid = not (ours["lost"] + ours["duplicated"] + peer["lost"] + peer["duplicated"] + dropped)
        record.valid &= sent == points


if __name__ == "__main__":
    main()
