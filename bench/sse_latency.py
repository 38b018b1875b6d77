"""Latency from `trainmaster.log()` to an SSE client receiving the point, against raw LISTEN/NOTIFY.

The API: `trainmaster api` on a scratch database with one queued job. This process reads
GET /v1/jobs/{id}/metrics/stream (`trainmaster.sse.parse`); once it answers, a second process logs
`{"t_sent": time.time(), "loss": ...}` through the SDK's `MetricsSender` (what `trainmaster.log` uses) at
`--rate` points/s for `--warmup` + `--duration` seconds. Latency is arrival time minus t_sent (one clock);
warm-up points are checked for loss but not timed. The sender's transport times each POST, which splits
the latency into the wait in the sender's buffer, the POST round trip and the SSE delivery after it.

The peer: a second process sends `pg_notify(channel, '<i>:<time.time()>')` at the same rate for the same
time on the same server; this process LISTENs. (The API's fan-out is a NOTIFY per batch, then a read.)

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
from harness import api_process, ms, parse_args, percentile, run, scratch_database, submit_job

from trainmaster.context import JobApi
from trainmaster.metrics import MetricsSender
from trainmaster.sse import parse

CHANNEL, SENT = "tm_bench_latency", "t_sent"
Received = dict[int, list[tuple[float, float]]]  # step -> [(received at, t_sent)], more than one if duplicated
Posts = list[tuple[float, float, list[int]]]  # per metrics POST: when it left, when its answer came, its steps
Produced = tuple[int, int, Posts]  # points sent, points dropped, the POSTs
Starter = Callable[[], None]  # starts the producer, once the consumer listens


def paced(rate: float, points: int) -> Iterator[int]:
    """0..points-1, each at its slot on a fixed schedule."""
    start = time.monotonic()
    for i in range(points):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        yield i


class TimedApi(JobApi):
    """Records, per metrics POST, when it left, when its answer came, and the steps it carried."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posts: Posts = []

    def post_metrics(self, batch: dict[str, Any]) -> tuple[int, bytes]:
        started = time.time()
        answer = super().post_metrics(batch)
        self.posts.append((started, time.time(), [p["step"] for p in batch["points"] if SENT in p["values"]]))
        return answer


def log_points(api_url: str, token: str, job_id: str, rate: float, points: int) -> Produced:
    """The API's producer (a spawned process)."""
    api = TimedApi(api_url, token, job_id, None)
    sender = MetricsSender(api, rank=0)
    for i in paced(rate, points):
        sender.log({SENT: time.time(), "loss": 1 / (i + 1)}, step=i)
    sender.close(timeout=30)
    return sender.sent_points, sender.dropped, api.posts


def notify_points(database_url: str, rate: float, points: int) -> Produced:
    """The peer's producer (a spawned process)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        for i in paced(rate, points):
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{i}:{time.time()!r}"))
    return points, 0, []


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


def measure(
    produce: Callable[..., Produced],
    produce_args: tuple[Any, ...],
    consume: Callable[[Starter], Received],
    budget_s: float,
) -> tuple[Received, Produced]:
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


def split(received: Received, posts: Posts, skip: int) -> list[dict[str, Any]]:
    """The API's latency per measured point, in three parts: buffer wait, POST round trip, SSE after the answer."""
    post_of = {step: (started, answered) for started, answered, steps in posts for step in steps}
    hits = [(*post_of[step], *hit) for step, at in received.items() if step >= skip and step in post_of for hit in at]
    parts = {
        "in the sender's buffer": [started - sent for started, _, _, sent in hits],
        "POST round trip": [answered - started for started, answered, _, _ in hits],
        "SSE after the answer": [at - answered for _, answered, at, _ in hits],
    }
    per_post = {"posts": len(posts), "points_per_post_p50": percentile([len(steps) for _, _, steps in posts], 50)}
    return [{"part": part, **ms(values, 50, 95), **per_post} for part, values in parts.items()]


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
    with run("sse_latency", args) as record, scratch_database(record, args.database_url) as db:
        with api_process(db.url) as api:
            job_id = submit_job(api.url, db.token)
            print(f"API: {points} points at {args.rate:g}/s through MetricsSender to SSE", flush=True)
            producer = (api.url, db.token, job_id, args.rate, points)
            consume = functools.partial(consume_sse, api.url, db.token, job_id, points, budget_s)
            received, (sent, dropped, posts) = measure(log_points, producer, consume, budget_s)
        print("peer: LISTEN/NOTIFY at the same rate", flush=True)
        consume = functools.partial(consume_notify, db.url, points, budget_s)
        peer_received, _ = measure(notify_points, (db.url, args.rate, points), consume, budget_s)
        api_row = row("trainmaster.log -> SSE", received, points, skip)
        peer_row = row("peer: LISTEN/NOTIFY", peer_received, points, skip)
        record.tables["latency"] = [api_row, peer_row]
        record.tables["API latency, split"] = split(received, posts, skip)
        for pct in ("p50_ms", "p95_ms"):
            record.ratio(f"{api_row['path']}, {pct.replace('_', ' ')}", api_row[pct], peer_row["path"], peer_row[pct])
        record.ratio(f"{api_row['path']}, p95 ms (goal <= 150)", api_row["p95_ms"], "goal", 150.0)
        losses = api_row["lost"] + api_row["duplicated"] + peer_row["lost"] + peer_row["duplicated"]
        record.valid = not losses and not dropped and sent == points


if __name__ == "__main__":
    main()
