"""`trainmaster.log()`: per-step metrics from training code that never slow the step.

`log` appends to a bounded in-process buffer and returns; a daemon thread sends the points to
`POST /v1/jobs/{id}/metrics` with the job's token, retrying with backoff through API or database
outages. It sends at once when it is idle (a point logged after a quiet spell reaches the API in one
round trip), and under load batches: at most one request per MIN_INTERVAL_S, up to 1,000 points
each, so a fast training loop pays for a few requests a second, not one per step. Each batch
carries an id, so a retry after a lost answer stores nothing twice. If the buffer overflows during a
long outage the newest points are dropped. A batch the API refuses is refused whole (422), with each
bad point named by its index: the sender drops exactly those and sends the rest again, so one bad
value (a negative step, an empty or overlong name) costs that point only. A batch refused with 429
(past a write limit of the job or its project: points a second, distinct names) is dropped, not resent:
the sender prints the API's reason once and holds its next request back, from LIMITED_BACKOFF_S
doubling to MAX_LIMITED_BACKOFF_S while refusals go on, so a job over its limit costs the API one
refused request every few seconds and keeps training. Points lost any of these ways are
counted and told to the job's owner: a `metrics_dropped` job event with the totals (`dropped`: buffer
full, `rejected`: refused by the API, and some of the API's reasons) and the same line in the job's
log, at once and then at most every REPORT_INTERVAL_S. Training never blocks or fails for any of it.
Outside a trainmaster job (no TRAINMASTER_JOB_ID) `log` does nothing, so scripts run anywhere.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import http.client
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

import httpx

from trainmaster.context import ENV_WORKER_RANK, JobApi, JobContext

FLUSH_INTERVAL_S = 0.2  # longest sleep of the sender thread without news
MIN_INTERVAL_S = 0.1  # under load, one request per this long: the batching that keeps training cheap
BATCH_POINTS = 1000
BUFFER_POINTS = 100_000
MAX_BACKOFF_S = 5.0
TOO_MANY_REQUESTS = 429
LIMITED_BACKOFF_S = 1.0  # the API's Retry-After for a rate is at least a second
MAX_LIMITED_BACKOFF_S = 30.0
REPORT_INTERVAL_S = 10.0  # a bug that logs a bad value every step must not write an event per batch
SHOWN_REASONS = 5


WORLD_SIZE = "sys/world_size"  # with rank 0's first point of each worker group: a chart's worker count


class MetricsSender:
    def __init__(self, api: JobApi, rank: int, *, buffer_points: int = BUFFER_POINTS, world_size: int | None = None):
        self.api = api
        self.attempt = api.attempt
        self.rank = rank
        # Said once per worker process, with its first point: a group Ray Train restarted at another
        # size (elastic gangs) starts new processes, so the series steps where the gang was resized.
        self.world_size = world_size if rank == 0 else None
        self.capacity = buffer_points
        self.buffer: collections.deque[dict[str, Any]] = collections.deque()
        self.dropped = 0  # buffer full
        self.rejected = 0  # refused by the API
        self.reasons: list[str] = []  # some of the API's reasons for the refusals not yet reported
        self.reported = (0, 0)  # (dropped, rejected) as the last event told them
        self.printed = (0, 0)
        self.limited_backoff = 0.0  # the wait after the latest 429; 0 while batches are stored
        self.limited_printed = False  # a 429's reason is printed once per process
        self.resume_at = 0.0  # no request before this time.monotonic(): the API refused one with 429
        self.next_report = 0.0
        self.sent_points = 0
        self.wake = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="trainmaster-metrics", daemon=True)
        self.thread.start()

    def log(self, values: dict[str, float], step: int | None) -> None:
        if len(self.buffer) >= self.capacity:
            self.dropped += 1
            return
        if self.idle.is_set():
            self.idle.clear()
        if self.world_size is not None:
            values = {WORLD_SIZE: float(self.world_size), **values}
            self.world_size = None
        # ts as Unix seconds (the API reads numbers as such): no date formatting in the training step.
        self.buffer.append({"step": step, "values": values, "rank": self.rank, "ts": time.time()})
        if len(self.buffer) == 1 or len(self.buffer) >= BATCH_POINTS:
            self.wake.set()  # the first point after a send: the sender goes now, or as soon as allowed

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything buffered; True when the buffer emptied within `timeout`."""
        self.wake.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.buffer and self.idle.is_set():
                return True
            if self.resume_at > deadline:  # held back by a 429 past the deadline: waiting is no use
                return False
            self.wake.set()
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=1)
        self._report_dropped(final=True)

    def _run(self) -> None:
        _yield_to_training()
        backoff = 0.1
        pending: dict[str, Any] | None = None
        last_send = 0.0
        while True:
            self.wake.wait(FLUSH_INTERVAL_S)
            self.wake.clear()
            wait = last_send + MIN_INTERVAL_S - time.monotonic()
            if wait > 0 and len(self.buffer) < BATCH_POINTS and not self.stopping:
                time.sleep(wait)  # under load: let this interval's points go in one request
            last_send = time.monotonic()
            while True:
                if not self._hold_back():
                    return
                if pending is None:
                    points = [self.buffer.popleft() for _ in range(min(BATCH_POINTS, len(self.buffer)))]
                    if not points:
                        break
                    pending = {"batch_id": str(uuid.uuid4()), "attempt": self.attempt, "points": points}
                if not self._send(pending):
                    time.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    if self.stopping:
                        return
                    continue
                backoff = 0.1
                self.sent_points += len(pending["points"])
                pending = None
                self._report_dropped()
                if len(self.buffer) < BATCH_POINTS and not self.stopping:
                    break  # a partial batch waits for the next interval: fewer, fuller requests
            self._report_dropped()  # one the interval held back
            if pending is None and not self.buffer:
                self.idle.set()
            elif self.buffer:
                self.wake.set()  # points came during the request: next interval
            if self.stopping:
                return

    def _send(self, batch: dict[str, Any]) -> bool:
        """False to try again later: no answer, or 5xx. True once the batch is done with: stored, or the
        points the API refused counted and dropped (all of them for a 429) and the rest sent again until
        stored."""
        while True:
            try:
                status, answer = self.api.post_metrics(batch)
            except (httpx.HTTPError, OSError, http.client.HTTPException):
                return False
            if status == TOO_MANY_REQUESTS:
                self._limited(answer, len(batch["points"]))
                return True
            if status >= 500:
                return False
            if status < 300:
                self.limited_backoff = 0.0
                return True
            points = batch["points"]
            refused, reasons = refused_points(status, answer, len(points))
            self.rejected += len(refused)
            self.reasons += reasons[: SHOWN_REASONS - len(self.reasons)]
            batch["points"] = [point for index, point in enumerate(points) if index not in refused]
            if not batch["points"]:
                return True

    def _limited(self, answer: bytes, count: int) -> None:
        """A batch refused for a write limit: dropped and counted, the reason printed the first time, the
        next request held back."""
        _, reasons = refused_points(TOO_MANY_REQUESTS, answer, count)
        self.rejected += count
        self.reasons += reasons[: SHOWN_REASONS - len(self.reasons)]
        if not self.limited_printed:
            print(f"[trainmaster] metric points dropped: {reasons[0]}", file=sys.stderr, flush=True)
            self.limited_printed = True
        self.limited_backoff = min(max(self.limited_backoff * 2, LIMITED_BACKOFF_S), MAX_LIMITED_BACKOFF_S)
        self.resume_at = time.monotonic() + self.limited_backoff

    def _hold_back(self) -> bool:
        """Wait out a 429's backoff; False when the sender is stopping meanwhile (what is left is dropped)."""
        while (wait := self.resume_at - time.monotonic()) > 0:
            if self.stopping:
                return False
            time.sleep(min(wait, FLUSH_INTERVAL_S))
        return True

    def _report_dropped(self, *, final: bool = False) -> None:
        counts = (self.dropped, self.rejected)
        if counts == self.reported or (not final and time.monotonic() < self.next_report):
            return
        self.next_report = time.monotonic() + REPORT_INTERVAL_S
        dropped, rejected = counts
        lost = [f"{dropped} dropped (buffer full during an outage)"] if dropped else []
        lost += [f"{rejected} refused by the API"] if rejected else []
        message = f"metric points lost on rank {self.rank}: {', '.join(lost)}"
        if self.reasons:
            message += f" ({'; '.join(self.reasons)})"
        if counts != self.printed:
            print(f"[trainmaster] {message}", file=sys.stderr, flush=True)
            self.printed = counts
        data = {"dropped": dropped, "rejected": rejected, "rank": self.rank, "reasons": self.reasons}
        try:
            if self.api.post_event("metrics_dropped", message, data).status_code < 300:
                self.reported = counts
                self.reasons = []
        except httpx.HTTPError:
            pass


def refused_points(status: int, answer: bytes, count: int) -> tuple[set[int], list[str]]:
    """The indices of a refused batch's points that the API's answer names, and why; every index when it
    names none, or names something outside the points (the batch as a whole: 401, 404, 413, malformed).

    A 422 for a batch names each bad point as `loc: ["body", "points", <index>, <field>, …]`."""
    try:
        body = json.loads(answer)
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    named: set[int] = set()
    reasons: list[str] = []
    for error in detail if status == 422 and isinstance(detail, list) else []:
        loc = error.get("loc") if isinstance(error, dict) else None
        if not (isinstance(loc, list) and loc[:2] == ["body", "points"] and len(loc) > 2):
            named.clear()
            break
        index = loc[2]
        if not (isinstance(index, int) and 0 <= index < count):
            named.clear()
            break
        named.add(index)
        field = ".".join(str(part) for part in loc[3:])
        reasons.append(f"points[{index}].{field}: {error.get('msg')}"[:300])
    if not named:
        return set(range(count)), [f"the batch of {count}: {status} {answer[:300].decode(errors='replace')}"]
    return named, reasons


def _yield_to_training() -> None:
    """Lowest CPU priority for this thread (Linux: a thread's own nice value), so that on a busy core
    the training threads are never preempted to send a batch: the sender runs when they wait (in a
    collective, on data); batching absorbs the delay. Elsewhere a no-op."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


_sender: MetricsSender | None = None
_sender_pid: int | None = None
_lock = threading.Lock()


def _current() -> MetricsSender | None:
    global _sender, _sender_pid
    if _sender is not None and _sender_pid == os.getpid():
        return _sender
    context = JobContext.from_env()
    if context is None or not context.can_report:
        return None
    with _lock:
        if _sender is None or _sender_pid != os.getpid():  # a forked child gets its own thread
            _sender = MetricsSender(context.api(), _rank(), world_size=_world_size())
            _sender_pid = os.getpid()
            atexit.register(_sender.close)
    return _sender


def _rank() -> int:
    # The launcher's own variable first: mpirun's ranks inherit rank 0's worker's environment.
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PADDLE_TRAINER_ID", "SLURM_PROCID", ENV_WORKER_RANK):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _world_size() -> int | None:
    """The gang's size as the launcher set it (torch's WORLD_SIZE, Ray Train's for every torch worker)."""
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PADDLE_TRAINERS_NUM", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def log(values: dict[str, float], step: int | None = None) -> None:
    """Record metrics for this step. Never blocks; a no-op outside a trainmaster job."""
    sender = _current()
    if sender is not None:
        sender.log({k: float(v) for k, v in values.items()}, step)


def flush(timeout: float = 10.0) -> bool:
    """Send everything logged so far (called for you when the training function returns and at exit)."""
    sender = _sender if _sender_pid == os.getpid() else None
    return True if sender is None else sender.flush(timeout)
