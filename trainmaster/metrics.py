"""`trainmaster.log()`: per-step metrics from training code that never slow the step.

`log` appends to a bounded in-process buffer and returns; a daemon thread sends the points to
`POST /v1/jobs/{id}/metrics` with the job's token, retrying with backoff through API or database
outages. It sends at once when it is idle (a point logged after a quiet spell reaches the API in one
round trip), and under load batches: at most one request per MIN_INTERVAL_S, up to 1,000 points
each, so a fast training loop pays for a few requests a second, not one per step. Each batch
carries an id, so a retry after a lost answer stores nothing twice. If the buffer overflows during a
long outage the newest points are dropped and the count is reported as a job event once the API
answers again; training never blocks or fails for it.
Outside a trainmaster job (no TRAINMASTER_JOB_ID) `log` does nothing, so scripts run anywhere.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import http.client
import os
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


class MetricsSender:
    def __init__(self, api: JobApi, rank: int, *, buffer_points: int = BUFFER_POINTS):
        self.api = api
        self.attempt = api.attempt
        self.rank = rank
        self.capacity = buffer_points
        self.buffer: collections.deque[dict[str, Any]] = collections.deque()
        self.dropped = 0
        self.reported_dropped = 0
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
            self.wake.set()
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=1)

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
            if pending is None and not self.buffer:
                self.idle.set()
            elif self.buffer:
                self.wake.set()  # points came during the request: next interval
            if self.stopping:
                return

    def _send(self, batch: dict[str, Any]) -> bool:
        try:
            status = self.api.post_metrics(batch)
        except (httpx.HTTPError, OSError, http.client.HTTPException):
            return False
        # Retry 5xx and 429; a 2xx is done, and a 4xx is a batch no retry can fix (dropped).
        return not (status >= 500 or status == 429)

    def _report_dropped(self) -> None:
        dropped = self.dropped
        if dropped <= self.reported_dropped:
            return
        message = f"{dropped} metric points dropped on rank {self.rank} (buffer full during an outage)"
        try:
            if (
                self.api.post_event("metrics_dropped", message, {"dropped": dropped, "rank": self.rank}).status_code
                < 300
            ):
                self.reported_dropped = dropped
        except httpx.HTTPError:
            pass


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
            _sender = MetricsSender(context.api(), _rank())
            _sender_pid = os.getpid()
            atexit.register(_sender.close)
    return _sender


def _rank() -> int:
    # The launcher's own variable first: mpirun's ranks inherit rank 0's worker's environment.
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PADDLE_TRAINER_ID", "SLURM_PROCID", ENV_WORKER_RANK):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def log(values: dict[str, float], step: int | None = None) -> None:
    """Record metrics for this step. Never blocks; a no-op outside a trainmaster job."""
    sender = _current()
    if sender is not None:
        sender.log({k: float(v) for k, v in values.items()}, step)


def flush(timeout: float = 10.0) -> bool:
    """Send everything logged so far (called for you when the training function returns and at exit)."""
    sender = _sender if _sender_pid == os.getpid() else None
    return True if sender is None else sender.flush(timeout)
