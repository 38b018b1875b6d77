"""Latency from a `trainmaster.log()` call to an SSE client receiving the point, against raw LISTEN/NOTIFY.

What it measures
    The script creates a fresh database `tm_bench_<random>` on `--database-url`, migrates it, makes a
    project token, and starts the real `trainmaster api` console script as a subprocess on a free
    loopback port. It submits one job (`POST /v1/jobs`; no dispatcher runs, so it stays queued) and
    makes a job token for it, as the dispatcher would for training code.

    The consumer (this process) opens `GET /v1/jobs/{id}/metrics/stream` with the project token and
    parses it with `trainmaster.sse.parse`. Once the stream answers, a producer process (multiprocessing,
    spawn) constructs the real `trainmaster.metrics.MetricsSender` (the class behind `trainmaster.log`)
    and logs `{"t_sent": time.time(), "loss": ...}` with `step = i` at `--rate` points/s for
    `--warmup` + `--duration` seconds. Each key becomes its own metric row; for every `t_sent` row the
    consumer receives it records `time.time() - t_sent` (one clock: both processes run here). Points of
    the first `--warmup` seconds are checked for loss and duplicates but left out of the latency figures.
    The sender's HTTP transport is wrapped to time each POST, which splits the latency into the wait in
    the sender's buffer (it flushes every 200 ms), the POST round trip, and SSE delivery after it.

The peer
    A raw PostgreSQL LISTEN/NOTIFY round trip, measured in the same script: a producer process with one
    psycopg autocommit connection sends `pg_notify(channel, '<i>:<time.time()>')` at the same rate for
    the same time; this process LISTENs on another connection and records `time.time() - t_sent`.
    That is the floor under the API's stream: the API's own fan-out is a NOTIFY per batch, then a read.

Run it from the repository root (results go to bench/results/sse_latency.{json,md}):

    .venv/bin/python bench/sse_latency.py [--rate 50] [--duration 20] [--warmup 2]

Before measuring it waits (up to `--quiet-timeout` seconds, polling every 10 s) for the 1-minute load
average to fall below `--quiet-load`, then proceeds anyway and records it. Everything it creates (the
API process, the database) is removed at the end, on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import queue
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import (
    DEFAULT_DATABASE_URL,
    RESULTS,
    job_token,
    load_1m,
    percentile,
    project_token,
    raise_on_sigterm,
    run_main,
    run_metadata,
    running_api,
    scratch_database,
    submit_job,
    wait_for_quiet,
    write_results,
)

from api.db import migrate
from api.settings import libpq_url
from trainmaster.sse import parse

NAME = "sse_latency"
PRODUCER_START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 10.0
TARGET_P95_MS = 300.0
NOTIFY_CHANNEL = "tm_bench_latency"
SENT_KEY = "t_sent"

API_ROW = "trainmaster.log -> SSE"
PEER_ROW = "peer: LISTEN/NOTIFY"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class ProducerConfig:
    """What a producer process needs; pickled into it."""

    kind: str  # "sender" (MetricsSender to the API) or "notify" (raw pg_notify)
    target: str  # API base URL, or the libpq URL of the bench database
    token: str
    job_id: str
    rate: float
    points: int


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL, help="server to create the bench DB on")
    parser.add_argument("--rate", type=float, default=50.0, help="points logged per second (default 50)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds (default 20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first (default 2)")
    parser.add_argument("--quiet-load", type=float, default=1.5, help="wait for a 1-min load average below this")
    parser.add_argument("--quiet-timeout", type=float, default=300.0, help="seconds to wait for it; 0: do not")
    parser.add_argument("--output", type=Path, default=RESULTS / f"{NAME}.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.warmup < 0 or args.quiet_timeout < 0:
        parser.error("--rate and --duration must be > 0, --warmup and --quiet-timeout >= 0")
    return args


def warmup_points(args: argparse.Namespace) -> int:
    return round(args.rate * args.warmup)


def total_points(args: argparse.Namespace) -> int:
    return warmup_points(args) + round(args.rate * args.duration)


# --------------------------------------------------------------------------- producers (second process)


class TimingTransport(httpx.HTTPTransport):
    """The sender's transport, recording when each metrics POST left and when its answer came back."""

    def __init__(self) -> None:
        super().__init__()
        self.posts: list[tuple[float, float, list[int]]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.time()
        response = super().handle_request(request)
        answered = time.time()
        if request.url.path.endswith("/metrics"):
            points = json.loads(request.content)["points"]
            steps = [p["step"] for p in points if SENT_KEY in p["values"]]
            self.posts.append((started, answered, steps))
        return response


def paced(points: int, rate: float) -> Iterator[int]:
    """Yield 0..points-1, each at its slot on a fixed schedule (no drift from slow iterations)."""
    start = time.monotonic()
    for i in range(points):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield i


def produce_with_sender(config: ProducerConfig) -> dict[str, Any]:
    from trainmaster.metrics import MetricsSender

    transport = TimingTransport()
    sender = MetricsSender(config.target, config.token, config.job_id, None, 0, transport=transport)
    late = 0.0
    schedule_start = time.monotonic()
    for i in paced(config.points, config.rate):
        late = max(late, time.monotonic() - (schedule_start + i / config.rate))
        sender.log({SENT_KEY: time.time(), "loss": 1.0 / (i + 1)}, step=i)
    sender.close(timeout=30)
    return {
        "logged": config.points,
        "sent_points": sender.sent_points,
        "dropped": sender.dropped,
        "left_in_buffer": len(sender.buffer),
        "max_late_s": late,
        "posts": transport.posts,
    }


def produce_with_notify(config: ProducerConfig) -> dict[str, Any]:
    with psycopg.connect(config.target, autocommit=True, connect_timeout=10) as conn:
        for i in paced(config.points, config.rate):
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, f"{i}:{time.time()!r}"))
    return {"logged": config.points}


def producer_main(config: ProducerConfig, results: multiprocessing.Queue[tuple[str, Any]]) -> None:
    """Entry point of a producer process: the parent owns Ctrl-C and ends this process itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        produce = produce_with_sender if config.kind == "sender" else produce_with_notify
        results.put(("ok", produce(config)))
    except Exception:
        results.put(("error", traceback.format_exc()))


class Producer:
    """A producer process started on demand and joined (or killed) at the end."""

    def __init__(self, config: ProducerConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self.config = config
        self.results: multiprocessing.Queue[tuple[str, Any]] = context.Queue()
        self.process = context.Process(target=producer_main, args=(config, self.results), name=f"bench-{config.kind}")

    def start(self) -> None:
        self.process.start()

    def result(self) -> dict[str, Any]:
        budget = PRODUCER_START_TIMEOUT_S + self.config.points / self.config.rate + 60
        try:
            status, payload = self.results.get(timeout=budget)
        except queue.Empty:
            raise RuntimeError(f"the {self.config.kind} producer sent nothing within {budget:.0f} s") from None
        if status != "ok":
            raise RuntimeError(f"the {self.config.kind} producer failed:\n{payload}")
        return dict(payload)

    def stop(self) -> None:
        if self.process.pid is None:
            return
        if self.process.is_alive():
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


# --------------------------------------------------------------------------- consumers (this process)


@dataclass
class Received:
    """What a consumer got: per step the receive time and t_sent, plus every sequence number seen."""

    at: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    seqs: Counter[int] = field(default_factory=Counter)
    other_rows: int = 0

    def add(self, step: int, sent: float, now: float) -> None:
        self.at.setdefault(step, []).append((now, sent))

    def count(self) -> int:
        return sum(len(v) for v in self.at.values())


def record_items(received: Received, items: list[dict[str, Any]], now: float) -> None:
    for item in items:
        received.seqs[item["seq"]] += 1
        if item["name"] == SENT_KEY:
            received.add(item["step"], item["value"], now)
        else:
            received.other_rows += 1


def lines_until(lines: Iterator[str], deadline: float) -> Iterator[str]:
    """The stream's lines (keepalive comments included) until the monotonic `deadline`."""
    for line in lines:
        if time.monotonic() > deadline:
            return
        yield line


def complete(received: Received, expected: int) -> bool:
    """All rows came, or the last one did (the stream is ordered, so anything missing is lost)."""
    return received.count() >= expected or (expected - 1) in received.at


def consume_sse(
    api_url: str, token: str, job_id: str, expected: int, budget_s: float, on_ready: Callable[[], None]
) -> Received:
    """Read the metrics stream until every t_sent row came, or for at most `budget_s` seconds."""
    received = Received()
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(10.0, read=budget_s)
    deadline = time.monotonic() + budget_s
    with (
        httpx.Client(base_url=api_url, headers=headers, timeout=timeout) as client,
        client.stream("GET", f"/v1/jobs/{job_id}/metrics/stream") as response,
    ):
        response.raise_for_status()
        ready = False
        for event in parse(lines_until(response.iter_lines(), deadline)):
            now = time.time()
            if event.event == "metrics":
                record_items(received, event.data["items"], now)
            elif event.event == "end":
                break
            if not ready:  # the first event (the job's status) says the stream is live
                ready = True
                on_ready()
            if complete(received, expected):
                break
    return received


def consume_notify(database_url: str, expected: int, budget_s: float, on_ready: Callable[[], None]) -> Received:
    received = Received()
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        on_ready()
        for notify in conn.notifies(timeout=budget_s):
            now = time.time()
            step, _, sent = notify.payload.partition(":")
            received.add(int(step), float(sent), now)
            if complete(received, expected):
                break
    return received


# --------------------------------------------------------------------------- one measured phase


def run_phase(
    config: ProducerConfig, consume: Callable[[Callable[[], None]], Received]
) -> tuple[Received, dict[str, Any]]:
    """Start the consumer; once it listens, start the producer; return what each saw."""
    producer = Producer(config)
    try:
        received = consume(producer.start)
        if producer.process.pid is None:
            raise RuntimeError("the consumer never became ready, so the producer was not started")
        return received, producer.result()
    finally:
        producer.stop()


def budget_s(args: argparse.Namespace) -> float:
    """How long a consumer waits in all: the producer's start, its schedule, then a drain."""
    return PRODUCER_START_TIMEOUT_S + total_points(args) / args.rate + DRAIN_TIMEOUT_S


def api_phase(
    api_url: str, project_tok: str, job_tok: str, job_id: str, args: argparse.Namespace
) -> tuple[Received, dict[str, Any]]:
    expected = total_points(args)
    config = ProducerConfig("sender", api_url, job_tok, job_id, args.rate, expected)
    return run_phase(config, lambda ready: consume_sse(api_url, project_tok, job_id, expected, budget_s(args), ready))


def peer_phase(database_url: str, args: argparse.Namespace) -> tuple[Received, dict[str, Any]]:
    expected = total_points(args)
    target = libpq_url(database_url)
    config = ProducerConfig("notify", target, "", "", args.rate, expected)
    return run_phase(config, lambda ready: consume_notify(target, expected, budget_s(args), ready))


# --------------------------------------------------------------------------- statistics and report


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": percentile(ordered, 50) * 1000,
        "p95_ms": percentile(ordered, 95) * 1000,
        "p99_ms": percentile(ordered, 99) * 1000,
        "max_ms": (ordered[-1] * 1000) if ordered else math.nan,
        "mean_ms": (sum(ordered) / len(ordered) * 1000) if ordered else math.nan,
    }


def integrity(received: Received, expected: int) -> dict[str, Any]:
    steps = set(received.at)
    duplicated = sorted(step for step, hits in received.at.items() if len(hits) > 1)
    return {
        "expected": expected,
        "received": received.count(),
        "missing": len(set(range(expected)) - steps),
        "duplicated": len(duplicated),
        "unexpected": len(steps - set(range(expected))),
        "duplicate_seqs": sum(1 for n in received.seqs.values() if n > 1),
        "other_rows": received.other_rows,  # the `loss` row of each point, on the API path
    }


def latencies(received: Received, skip: int) -> list[float]:
    return [now - sent for step, hits in received.at.items() if step >= skip for now, sent in hits]


def row_stats(received: Received, expected: int, skip: int) -> dict[str, Any]:
    values = latencies(received, skip)
    return {"count": len(values), **summary_ms(values), "integrity": integrity(received, expected)}


def breakdown(received: Received, posts: list[tuple[float, float, list[int]]], skip: int) -> dict[str, Any]:
    """Per measured point: time in the sender's buffer, the POST round trip, SSE delivery after the answer."""
    post_of = {step: (started, answered) for started, answered, steps in posts for step in steps}
    buffer, rtt, after = [], [], []
    for step, hits in received.at.items():
        if step < skip or step not in post_of:
            continue
        started, answered = post_of[step]
        for now, sent in hits:
            buffer.append(started - sent)
            rtt.append(answered - started)
            after.append(now - answered)
    sizes = [len(steps) for _, _, steps in posts]
    return {
        "buffer_wait": summary_ms(buffer),
        "post_round_trip": summary_ms(rtt),
        "sse_after_answer": summary_ms(after),
        "posts": len(posts),
        "points_per_post_mean": (sum(sizes) / len(sizes)) if sizes else math.nan,
    }


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    header = f"{'path':<26} {'count':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'lost':>5} {'dup':>4}"
    lines = [header, "-" * len(header)]
    for name, s in rows.items():
        i = s["integrity"]
        lines.append(
            f"{name:<26} {s['count']:>6} {s['p50_ms']:>8.1f} {s['p95_ms']:>8.1f} {s['p99_ms']:>8.1f}"
            f" {s['max_ms']:>8.1f} {i['missing']:>5} {i['duplicated']:>4}"
        )
    return "\n".join(lines)


def format_breakdown(parts: dict[str, Any]) -> str:
    lines = [f"{'API latency, split':<34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}"]
    for key, label in (
        ("buffer_wait", "log() -> POST leaves (buffer)"),
        ("post_round_trip", "POST round trip"),
        ("sse_after_answer", "SSE received - POST answered"),
    ):
        s = parts[key]
        lines.append(f"{label:<34} {s['p50_ms']:>8.1f} {s['p95_ms']:>8.1f} {s['max_ms']:>8.1f}")
    lines.append(f"{parts['posts']} POSTs, {parts['points_per_post_mean']:.1f} points each on average")
    return "\n".join(lines)


def markdown_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| path | count | p50 ms | p95 ms | p99 ms | max ms | lost | duplicated |", "|---|" + "---:|" * 7]
    for name, s in rows.items():
        i = s["integrity"]
        lines.append(
            f"| {name} | {s['count']} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} | {s['p99_ms']:.1f}"
            f" | {s['max_ms']:.1f} | {i['missing']} | {i['duplicated']} |"
        )
    return "\n".join(lines)


def problems(results: dict[str, Any]) -> list[str]:
    out = []
    for name, s in results["rows"].items():
        i = s["integrity"]
        if i["received"] != i["expected"] or i["missing"] or i["duplicated"] or i["unexpected"] or i["duplicate_seqs"]:
            out.append(f"{name}: {i}")
    api = results["rows"][API_ROW]["integrity"]
    if api["other_rows"] != api["expected"]:
        out.append(f"{API_ROW}: {api['other_rows']} `loss` rows received, expected {api['expected']}")
    sender = results["sender"]
    if sender["dropped"] or sender["left_in_buffer"] or sender["sent_points"] != sender["logged"]:
        out.append(
            f"MetricsSender: logged {sender['logged']}, sent {sender['sent_points']}, dropped {sender['dropped']}"
        )
    return out


def interpretation(results: dict[str, Any]) -> str:
    api, peer = results["rows"][API_ROW], results["rows"][PEER_ROW]
    verdict = "meets" if api["p95_ms"] <= TARGET_P95_MS else "misses"
    buffer = results["breakdown"]["buffer_wait"]
    return (
        f"p95 {api['p95_ms']:.0f} ms {verdict} the {TARGET_P95_MS:.0f} ms target; "
        f"{buffer['p50_ms']:.0f} ms of the {api['p50_ms']:.0f} ms p50 is the sender's 200 ms flush interval "
        f"(buffer wait), and raw NOTIFY takes {peer['p50_ms']:.1f} ms at p50."
    )


def build_results(
    args: argparse.Namespace,
    api: tuple[Received, dict[str, Any]],
    peer: tuple[Received, dict[str, Any]],
    loadavg: dict[str, Any],
) -> dict[str, Any]:
    expected, skip = total_points(args), warmup_points(args)
    (api_received, sender), (peer_received, _) = api, peer
    rows = {API_ROW: row_stats(api_received, expected, skip), PEER_ROW: row_stats(peer_received, expected, skip)}
    ratio = {k: rows[API_ROW][f"{k}_ms"] / rows[PEER_ROW][f"{k}_ms"] for k in ("p50", "p95", "p99")}
    return {
        **run_metadata(NAME, args, loadavg, python=".venv/bin/python"),
        "target_p95_ms": TARGET_P95_MS,
        "rows": rows,
        "ratio_api_over_notify": ratio,
        "breakdown": breakdown(api_received, sender["posts"], skip),
        "sender": {k: v for k, v in sender.items() if k != "posts"},
    }


def print_report(results: dict[str, Any]) -> None:
    print()
    print(format_table(results["rows"]))
    ratio = results["ratio_api_over_notify"]
    print("API / NOTIFY: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratio.items()))
    print()
    print(format_breakdown(results["breakdown"]))
    print("1-minute load average: " + ", ".join(f"{k} {v}" for k, v in results["loadavg_1m"].items()))
    for line in problems(results):
        print(f"WARNING {line}")
    print(interpretation(results))


def markdown(results: dict[str, Any]) -> str:
    load = results["loadavg_1m"]
    ratio = results["ratio_api_over_notify"]
    parts = results["breakdown"]
    cfg = results["config"]
    split = (
        f"Split of the API latency (p50 / p95 ms): in the sender's buffer {parts['buffer_wait']['p50_ms']:.1f} / "
        f"{parts['buffer_wait']['p95_ms']:.1f}, POST round trip {parts['post_round_trip']['p50_ms']:.1f} / "
        f"{parts['post_round_trip']['p95_ms']:.1f}, SSE received after the POST's answer "
        f"{parts['sse_after_answer']['p50_ms']:.1f} / {parts['sse_after_answer']['p95_ms']:.1f} "
        f"({parts['posts']} POSTs of {parts['points_per_post_mean']:.1f} points on average)."
    )
    return "\n".join(
        [
            "## Live metrics: `trainmaster.log()` to SSE client latency",
            "",
            "```",
            results["command"],
            "```",
            "",
            f"**Machine.** {results['machine']['cpus']} shared cores (another engineer's tests ran alongside); "
            f"PostgreSQL 15 on 127.0.0.1; Python {results['machine']['python']}; git `{results['git']}`; "
            f"measured {results['measured_at']}. 1-minute load average {load['start']:.2f} at the start "
            f"(waited {load['waited_s']:.0f} s for < {cfg['quiet_load']:g}), {load['end']:.2f} at the end.",
            "",
            f"{cfg['rate']:g} points/s for {cfg['warmup']:g} s (unmeasured) + {cfg['duration']:g} s; "
            "latency is `time.time()` at receipt minus the `t_sent` value logged.",
            "",
            markdown_table(results["rows"]),
            "",
            f"API / NOTIFY: p50 {ratio['p50']:.1f}x, p95 {ratio['p95']:.1f}x, p99 {ratio['p99']:.1f}x. {split}",
            "",
            interpretation(results),
            "",
        ]
    )


# --------------------------------------------------------------------------- main


def run_benchmark(args: argparse.Namespace, database_url: str, log_path: Path, quiet: dict[str, Any]) -> Any:
    """Everything between creating the database and dropping it; returns the results."""
    migrate.upgrade(database_url)
    token = project_token(database_url)
    with running_api(database_url, log_path) as (api_url, api):
        job_id = submit_job(api_url, token)
        job_tok = job_token(database_url, job_id)
        loadavg: dict[str, Any] = {**quiet, "start": load_1m()}
        print(f"api ready at {api_url}; job {job_id}; {total_points(args)} points at {args.rate:g}/s", flush=True)
        api_result = api_phase(api_url, token, job_tok, job_id, args)
        if api.poll() is not None:
            raise RuntimeError(f"trainmaster api exited with {api.returncode} during the run; see {log_path}")
        print("peer: LISTEN/NOTIFY at the same rate", flush=True)
        peer_result = peer_phase(database_url, args)
        loadavg["end"] = load_1m()
    return build_results(args, api_result, peer_result, loadavg)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    RESULTS.mkdir(parents=True, exist_ok=True)
    quiet = wait_for_quiet(args.quiet_load, args.quiet_timeout)
    with scratch_database(args.database_url) as database_url:
        results = run_benchmark(args, database_url, RESULTS / f"{NAME}.api.log", quiet)
    print_report(results)
    write_results(results, args.output, (args.output.with_suffix(".md"), markdown(results)))
    if problems(results):
        print("points were lost or duplicated: these figures are not valid", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "the API process was stopped and the database dropped")
