"""Latency from `trainmaster.log()` to an SSE client receiving the point, against raw LISTEN/NOTIFY.

The API: `trainmaster api` on a scratch database `tm_bench_<random>`, with one queued job. This process
opens GET /v1/jobs/{id}/metrics/stream and parses it with `trainmaster.sse.parse`; once the stream answers,
a second process logs `{"t_sent": time.time(), "loss": ...}` with step i through the SDK's
`trainmaster.metrics.MetricsSender` (what `trainmaster.log` uses; with a project token) at `--rate` points/s for
`--warmup` + `--duration` seconds. Latency is `time.time()` when the t_sent row arrives minus t_sent (both
processes share the clock); points of the warm-up are checked for loss but not timed. The sender's HTTP
transport times each POST, which splits the latency into the wait in the sender's buffer, the POST round
trip, and the SSE delivery after the POST's answer.

The peer: a raw PostgreSQL round trip on the same server: a second process sends
`pg_notify(channel, '<i>:<time.time()>')` at the same rate for the same time on one autocommit psycopg
connection; this process LISTENs on another. The API's fan-out is a NOTIFY per batch, then a read.

    .venv/bin/python bench/sse_latency.py [--rate 50] [--duration 20] [--warmup 2]
"""

from __future__ import annotations

import itertools
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from common import api_process, migrate_and_token, ms, parser, percentile, run, scratch_database, submit_job

from trainmaster.context import JobApi
from trainmaster.metrics import MetricsSender
from trainmaster.sse import parse

CHANNEL = "tm_bench_latency"
SENT = "t_sent"
Received = dict[int, list[tuple[float, float]]]  # step -> [(received at, t_sent)], more than one if duplicated
Consumer = Callable[[Callable[[], None]], Received]  # starts the producer (its argument) once it listens


@dataclass(frozen=True)
class Producer:
    target: str  # the API's URL, or the database's for the peer
    token: str
    job_id: str
    rate: float
    points: int


def paced(producer: Producer) -> Iterator[int]:
    """0..points-1, each at its slot on a fixed schedule."""
    start = time.monotonic()
    for i in range(producer.points):
        time.sleep(max(0.0, start + i / producer.rate - time.monotonic()))
        yield i


class TimedApi(JobApi):
    """Records, per metrics POST, when it left, when its answer came, and the steps it carried."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posts: list[tuple[float, float, list[int]]] = []

    def post_metrics(self, batch: dict[str, Any]) -> int:
        started = time.time()
        status = super().post_metrics(batch)
        self.posts.append((started, time.time(), [p["step"] for p in batch["points"] if SENT in p["values"]]))
        return status


def log_points(producer: Producer) -> dict[str, Any]:
    api = TimedApi(producer.target, producer.token, producer.job_id, None)
    sender = MetricsSender(api, rank=0)
    for i in paced(producer):
        sender.log({SENT: time.time(), "loss": 1 / (i + 1)}, step=i)
    sender.close(timeout=30)
    return {"sent_points": sender.sent_points, "dropped": sender.dropped, "posts": api.posts}


def notify_points(producer: Producer) -> dict[str, Any]:
    with psycopg.connect(producer.target, autocommit=True, connect_timeout=10) as conn:
        for i in paced(producer):
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{i}:{time.time()!r}"))
    return {"sent_points": producer.points, "dropped": 0, "posts": []}


def measure(
    produce: Callable[[Producer], dict[str, Any]],
    producer: Producer,
    consume: Consumer,
) -> tuple[Received, dict[str, Any]]:
    """Start the consumer; once it listens it starts the producer in a spawned process; what each saw."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        started: list[Any] = []
        received = consume(lambda: started.append(pool.apply_async(produce, (producer,))))
        if not started:
            raise RuntimeError("the consumer never became ready")
        return received, started[0].get(timeout=60 + producer.points / producer.rate)


def complete(received: Received, points: int) -> bool:
    """Every point came, or the last one did (the stream is ordered: anything still missing is lost)."""
    return len(received) >= points or points - 1 in received


def consume_sse(api_url: str, token: str, job_id: str, points: int, budget_s: float) -> Consumer:
    def consume(start_producer: Callable[[], None]) -> Received:
        received: Received = {}
        live = False
        deadline = time.monotonic() + budget_s
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=api_url, headers=headers, timeout=httpx.Timeout(10, read=budget_s)) as http,
            http.stream("GET", f"/v1/jobs/{job_id}/metrics/stream") as response,
        ):
            response.raise_for_status()
            lines = itertools.takewhile(lambda _: time.monotonic() < deadline, response.iter_lines())
            for event in parse(lines):
                now = time.time()
                for item in event.data["items"] if event.event == "metrics" else []:
                    if item["name"] == SENT:
                        received.setdefault(item["step"], []).append((now, item["value"]))
                if not live:  # the first event (the job's status) says the stream is live
                    live = True
                    start_producer()
                if event.event == "end" or complete(received, points):
                    break
        return received

    return consume


def consume_notify(database_url: str, points: int, budget_s: float) -> Consumer:
    def consume(start_producer: Callable[[], None]) -> Received:
        received: Received = {}
        with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            start_producer()
            for notify in conn.notifies(timeout=budget_s):
                step, _, sent = notify.payload.partition(":")
                received.setdefault(int(step), []).append((time.time(), float(sent)))
                if complete(received, points):
                    break
        return received

    return consume


def row(path: str, received: Received, points: int, skip: int) -> dict[str, Any]:
    latencies = [at - sent for step, hits in received.items() if step >= skip for at, sent in hits]
    return {
        "path": path,
        "points": len(latencies),
        **ms(latencies, 50, 95, 99),
        "max_ms": max(latencies, default=float("nan")) * 1000,
        "lost": len(set(range(points)) - set(received)),
        "duplicated": sum(len(hits) > 1 for hits in received.values()),
    }


def split(received: Received, posts: list[tuple[float, float, list[int]]], skip: int) -> list[dict[str, Any]]:
    """The API's latency per measured point, in three parts: buffer wait, POST round trip, SSE after the answer."""
    post_of = {step: (started, answered) for started, answered, steps in posts for step in steps}
    parts: dict[str, list[float]] = {"in the sender's buffer": [], "POST round trip": [], "SSE after the answer": []}
    for step, hits in received.items():
        if step >= skip and step in post_of:
            started, answered = post_of[step]
            for at, sent in hits:
                for part, seconds in zip(
                    parts.values(), (started - sent, answered - started, at - answered), strict=True
                ):
                    part.append(seconds)
    per_post = percentile([len(steps) for _, _, steps in posts], 50)
    return [
        {"part": k, **ms(v, 50, 95), "posts": len(posts), "points_per_post_p50": per_post} for k, v in parts.items()
    ]


def main() -> int:
    p = parser(__doc__, database=True)
    p.add_argument("--rate", type=float, default=50.0, help="points logged per second")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    args = p.parse_args()
    skip, points = round(args.rate * args.warmup), round(args.rate * (args.warmup + args.duration))
    budget_s = 60 + points / args.rate
    with run("sse_latency", args) as record, scratch_database(args.database_url) as database_url:
        record.read_postgres(database_url)
        token = migrate_and_token(database_url)
        with api_process(database_url) as api:
            job_id = submit_job(api.url, token)
            print(f"API: {points} points at {args.rate:g}/s through MetricsSender to SSE", flush=True)
            producer = Producer(api.url, token, job_id, args.rate, points)
            received, sender = measure(log_points, producer, consume_sse(api.url, token, job_id, points, budget_s))
        print("peer: LISTEN/NOTIFY at the same rate", flush=True)
        peer_producer = Producer(database_url, "", "", args.rate, points)
        peer_received, _ = measure(notify_points, peer_producer, consume_notify(database_url, points, budget_s))
        api_row = row("trainmaster.log -> SSE", received, points, skip)
        peer_row = row("peer: LISTEN/NOTIFY", peer_received, points, skip)
        record.tables["latency"] = [api_row, peer_row]
        record.tables["API latency, split"] = split(received, sender["posts"], skip)
        for pct in ("p50_ms", "p95_ms"):
            record.ratio(f"{api_row['path']}, {pct.replace('_', ' ')}", api_row[pct], peer_row["path"], peer_row[pct])
        record.ratio(f"{api_row['path']}, p95 ms (goal <= 150)", api_row["p95_ms"], "goal", 150.0)
        losses = api_row["lost"] + api_row["duplicated"] + peer_row["lost"] + peer_row["duplicated"]
        record.valid = not losses and not sender["dropped"] and sender["sent_points"] == points
    return 0 if record.valid else 1


if __name__ == "__main__":
    sys.exit(main())
